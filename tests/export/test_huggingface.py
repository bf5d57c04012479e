"""Importing transformers checkpoints (python -m export.huggingface), served beside the shipped models.

The checkpoints are tiny, randomly initialised and built here from their configs (nothing is
downloaded); each is saved with ``save_pretrained``, imported, and then served by a real server next
to the shipped ``vit/1`` and ``translator/3``, and its answers are compared with what transformers
itself computes for the same input.
"""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
import sentencepiece as spm
import torch
from PIL import Image

from contract.manifest import load_entry, read_manifest
from export import huggingface
from service.attention.rollout import class_token_rollout
from tests.conftest import ROOT, SHIPPED_TRANSLATOR, run_module
from tests.export.weights_files import assert_classifier_weights_stored_once
from tests.service.service_testing import png_bytes, start_subprocess_server

transformers = pytest.importorskip("transformers")

SHIPPED = ROOT / "models"
LABELS = ["cat", "dog", "bird", "fish", "horse"]
IMAGE_SIZE, PATCH = 32, 8
IMAGE_MODELS = {  # entry name -> transformers class
    "hf-vit": "ViTForImageClassification",
    "hf-deit": "DeiTForImageClassification",
    "hf-deit-teacher": "DeiTForImageClassificationWithTeacher",
}
# DeiT's own recipe: bicubic to a larger square, then the centre crop (here 40 -> 32)
PROCESSORS = {
    "hf-deit-teacher": {
        "resample": 3,
        "size": {"height": IMAGE_SIZE + 8, "width": IMAGE_SIZE + 8},
        "do_center_crop": True,
        "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
    }
}
MARIAN = "hf-marian"


def save_image_classifier(folder, architecture: str, **processor) -> None:
    """A tiny randomly initialised classifier and its image processor, as ``save_pretrained`` writes them."""
    config_cls = transformers.DeiTConfig if architecture.startswith("DeiT") else transformers.ViTConfig
    config = config_cls(
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        initializer_range=0.2,  # logits far enough apart that the top-k order is not decided by rounding
        id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)},
    )
    torch.manual_seed(len(architecture))
    getattr(transformers, architecture)(config).eval().save_pretrained(folder)
    settings = {"size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}, "image_mean": [0.485, 0.456, 0.406]}
    settings |= {"image_std": [0.229, 0.224, 0.225], "resample": 2} | processor
    transformers.ViTImageProcessorPil(**settings).save_pretrained(folder)


def test_image(seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)


test_image.__test__ = False  # a helper, not a test


# Real sentence pairs (English -> German): the tokenizers are trained on them, the translator fitted to them.
PAIRS = [
    ("Saves the current document.", "Speichert das aktuelle Dokument."),
    ("Open the file.", "Öffnen Sie die Datei."),
    ("Select the cells you want to format.", "Wählen Sie die Zellen aus, die Sie formatieren möchten."),
    ("Where is the nearest train station?", "Wo ist der nächste Bahnhof?"),
    ("The weather is nice today.", "Das Wetter ist heute schön."),
    ("Click the button to close the dialog.", "Klicken Sie auf die Schaltfläche, um den Dialog zu schließen."),
    ("Prints the active sheet.", "Druckt die aktive Tabelle."),
    ("I would like a cup of coffee.", "Ich hätte gern eine Tasse Kaffee."),
]


def sentencepiece_model(lines: list[str], vocab_size: int) -> bytes:
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines * 4),
        model_writer=buf,
        vocab_size=vocab_size,
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return buf.getvalue()


def save_marian(folder, fit_steps: int = 150) -> None:
    """A tiny MarianMTModel with MarianTokenizer's files, made as OPUS-MT's are: a source and a target
    SentencePiece model, one vocab.json numbering the pieces of both (``</s>`` 0, ``<unk>`` 1, ``<pad>``
    last, the decoder's start token). Randomly initialised, then fitted for a moment to the sentence
    pairs, so that it stops with ``</s>`` and beam search has real choices to make."""
    folder.mkdir(parents=True)
    (folder / "source.spm").write_bytes(sentencepiece_model([en for en, _ in PAIRS], 60))
    (folder / "target.spm").write_bytes(sentencepiece_model([de for _, de in PAIRS], 70))
    vocab = {"</s>": 0, "<unk>": 1}
    for name in ("source.spm", "target.spm"):
        sp = spm.SentencePieceProcessor(model_file=str(folder / name))
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)):
                vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    tokenizer = transformers.MarianTokenizer(
        str(folder / "source.spm"),
        str(folder / "target.spm"),
        str(folder / "vocab.json"),
        source_lang="en",
        target_lang="de",
    )
    tokenizer.save_pretrained(folder)
    pad = vocab["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(vocab),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        scale_embedding=True,
        activation_function="swish",
    )
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config)
    batch = tokenizer([en for en, _ in PAIRS], text_target=[de for _, de in PAIRS], padding=True, return_tensors="pt")
    batch["labels"][batch["labels"] == pad] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(fit_steps):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()
    model.eval().save_pretrained(folder)
    generation = transformers.GenerationConfig.from_model_config(config)
    generation.bad_words_ids, generation.num_beams, generation.max_length = [[pad]], 4, 128  # as OPUS-MT's
    generation.save_pretrained(folder)


@torch.no_grad()
def reference(folder, architecture: str, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """transformers' own answer for one image: (probabilities (classes,), attention (layer, head, T, T))."""
    model = getattr(transformers, architecture).from_pretrained(folder, attn_implementation="eager").eval()
    processor = transformers.AutoImageProcessor.from_pretrained(folder)
    inputs = processor(images=[Image.fromarray(pixels)], return_tensors="pt")
    out = model(**inputs, output_attentions=True)
    return out.logits.softmax(-1)[0].numpy(), torch.stack(out.attentions, dim=1)[0].numpy()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-checkpoints")
    for name, architecture in IMAGE_MODELS.items():
        save_image_classifier(root / name, architecture, **PROCESSORS.get(name, {}))
    save_marian(root / MARIAN)
    return root


@pytest.fixture(scope="module")
def repository(checkpoints, tmp_path_factory):
    """The shipped entries plus every imported checkpoint."""
    repo = tmp_path_factory.mktemp("hf-repo") / "models"
    for entry in (SHIPPED / "vit" / "1", SHIPPED_TRANSLATOR):
        shutil.copytree(entry, repo / entry.parent.name / entry.name)
    for name in [*IMAGE_MODELS, MARIAN]:
        args = ["--model-dir", str(checkpoints / name), "--name", name, "--repository", str(repo)]
        assert huggingface.main(args) == 0
    return repo


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    srv = start_subprocess_server(tmp_path_factory.mktemp("hf-server"), repository)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.mark.parametrize("name", sorted(IMAGE_MODELS))
def test_an_imported_classifier_records_its_contract_and_parity(repository, name):
    m = read_manifest(repository / name / "1")
    assert (m["version"], m["task"], m["labels"]) == ("1", "image-classification", LABELS)
    assert m["model"]["architecture"] == IMAGE_MODELS[name] and m["model"]["source"]["library"] == "transformers"
    prefix = 2 if "deit" in name else 1  # DeiT: the class and the distillation token
    grid = IMAGE_SIZE // PATCH
    assert {k: m["attention"][k] for k in ("layers", "heads", "tokens", "prefix_tokens", "grid", "patch_size")} == {
        "layers": 2,
        "heads": 4,
        "tokens": prefix + grid * grid,
        "prefix_tokens": prefix,
        "grid": [grid, grid],
        "patch_size": PATCH,
    }
    assert m["preprocessing"]["mean"] == [0.485, 0.456, 0.406] and m["preprocessing"]["color_mode"] == "RGB"
    parity = m["evaluation"]["parity"]
    assert parity["max_abs_logits"] <= huggingface.LOGITS_TOL and parity["argmax_identical"]
    assert parity["max_abs_attention"] <= huggingface.ATTENTION_TOL
    assert parity["preprocessing_max_abs"] <= huggingface.PREPROCESSING_TOL
    assert set(load_entry(repository / name / "1").manifest.files) == {
        "model.onnx",
        "model_attention.onnx",
        "weights.bin",
    }
    assert_classifier_weights_stored_once(repository / name / "1")


@pytest.mark.parametrize("name", sorted(IMAGE_MODELS))
def test_classify_and_attention_match_transformers_beside_the_shipped_models(server, checkpoints, name):
    pixels = test_image()
    probabilities, attention = reference(checkpoints / name, IMAGE_MODELS[name], pixels)
    upload = {"file": ("x.png", png_bytes(pixels), "image/png")}
    with server.client() as c:
        r = c.post("/classify", files=upload, data={"model": name, "top_k": "5", "return_attention": "true"})
        assert r.status_code == 200, r.text
        result = r.json()["results"][0]
        top = result["top_k"]
        assert [t["index"] for t in top] == list(np.argsort(-probabilities, kind="stable"))
        assert [t["label"] for t in top] == [LABELS[t["index"]] for t in top]
        np.testing.assert_allclose([t["score"] for t in top], np.sort(probabilities)[::-1], atol=1e-5)
        prefix = 2 if "deit" in name else 1
        grid = (IMAGE_SIZE // PATCH,) * 2
        rollout = class_token_rollout(attention, grid, prefix)
        np.testing.assert_allclose(np.array(result["attention"]["rollout"]), rollout, atol=1e-4)
        stored = c.get(f"/attention/{result['attention_id']}", params={"format": "npz"})
        maps = np.load(io.BytesIO(stored.content))
        np.testing.assert_allclose(maps["self_attention"], attention, atol=1e-5)
        assert json.loads(maps["meta.json"].tobytes())["prefix_tokens"] == prefix
        heatmap = c.get(f"/attention/{result['attention_id']}.png")
        assert heatmap.status_code == 200 and heatmap.headers["content-type"] == "image/png"
        shoe = {"file": ("s.png", (SHIPPED / "vit/1/sample-9-ankle-boot.png").read_bytes())}
        shipped = c.post("/classify", files=shoe, data={"model": "vit"}).json()  # served beside it, unchanged
        assert shipped["results"][0]["top_k"][0]["label"] == "Ankle boot"


def test_an_imported_marian_describes_its_tokenizer_pair_and_records_its_parity(repository):
    m = read_manifest(repository / MARIAN / "1")
    vocab = json.loads((repository / MARIAN / "1" / "vocab.json").read_text())
    pad = vocab["<pad>"]
    assert m["task"] == "translation" and m["languages"] == {"source": "en", "target": "de"}
    assert m["tokenizer"] == {
        "library": "sentencepiece-pair",
        "source_file": "source.spm",
        "target_file": "target.spm",
        "vocab_file": "vocab.json",
        "special_ids": {"pad": pad, "eos": 0, "unk": 1, "decoder_start": pad},  # Marian starts from <pad>
        "vocab_size": len(vocab),
        "normalization": None,
    }
    assert m["decoding"]["suppressed_ids"] == [pad] and m["decoding"]["beam"] == 4
    assert set(m["graphs"]) == {"encoder", "decoder", "decoder_prefix"}
    parity = m["evaluation"]["parity"]
    n = parity["sentences"]
    assert n == len(huggingface.PARITY_SENTENCES)
    assert parity["identical_source_ids"] == parity["identical_text"] == parity["identical_tokens"] == n
    assert parity["max_abs_log_probs"] <= 1e-4 and parity["prefix_vs_steps_max_abs"] <= 1e-4
    assert parity["max_abs_attention"] <= 1e-5 and parity["max_abs_encoder_attention"] <= 1e-5
    beam = parity["beam"]
    # Our beam search ends a sentence at its 4th finished hypothesis, as generate(early_stopping=True) does;
    # with the checkpoint's early_stopping=False generate() searches on, and what it finds there scores higher.
    assert beam["early_stopping"] is False and beam["early_stopping_true"] == {"identical": n, "differences": []}
    for d in beam["checkpoint"]["differences"]:
        assert d["transformers_score"] > d["our_score"]


@torch.no_grad()
def generate(folder, text: str, beam: int) -> tuple[str, list[str], np.ndarray]:
    """transformers' translation: (text, target pieces with </s>, last decoder layer's cross-attention
    averaged over heads for exactly those pieces)."""
    model = transformers.MarianMTModel.from_pretrained(folder, attn_implementation="eager").eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
    src = tokenizer(text, return_tensors="pt").input_ids
    limit = min(int(src.shape[1] * 1.5) + 10, model.config.max_position_embeddings)
    ids = model.generate(src, num_beams=beam, do_sample=False, early_stopping=True, max_length=limit + 1)[0]
    ids = ids[: (ids == 0).nonzero()[0, 0] + 1] if (ids == 0).any() else ids  # up to its </s>
    out = model(input_ids=src, decoder_input_ids=ids[None, :-1], output_attentions=True)
    alignment = out.cross_attentions[-1][0].mean(0).numpy()
    return tokenizer.decode(ids, skip_special_tokens=True), tokenizer.convert_ids_to_tokens(ids[1:]), alignment


@pytest.mark.parametrize("beam", [1, 4])
def test_translate_matches_generate_beside_the_shipped_translator(server, checkpoints, beam):
    texts = [PAIRS[0][0], PAIRS[3][0], "Open the current document.", "Where is the coffee?"]
    with server.client() as c:
        for text in texts:
            body = {"text": text, "model": MARIAN, "beam_size": beam, "return_attention": True}
            r = c.post("/translate", json=body)
            assert r.status_code == 200, r.text
            result = r.json()["results"][0]
            translation, pieces, alignment = generate(checkpoints / MARIAN, text, beam)
            assert result["translation"] == translation
            assert result["attention"]["target_tokens"] == pieces
            np.testing.assert_allclose(np.array(result["attention"]["alignment"]), alignment, atol=1e-4)
        shipped = c.post("/translate", json={"text": "Open the file.", "model": "translator"}).json()
        assert shipped["results"][0]["translation"] == "Öffnen Sie die Datei."  # served beside it, unchanged


def test_an_unsupported_architecture_is_one_clear_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"], "model_type": "bert"}))
    proc = run_module("export.huggingface", "--model-dir", str(tmp_path), "--name", "b", "--repository", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: unsupported architecture 'BertForMaskedLM' (model_type 'bert'); supported: "
        + ", ".join(sorted(huggingface.IMPORTERS))
    ]


def test_a_processor_the_service_cannot_reproduce_is_refused_unless_accepted(tmp_path):
    folder = tmp_path / "nearest"
    save_image_classifier(folder, "ViTForImageClassification", resample=0)
    args = ["--model-dir", str(folder), "--name", "nearest", "--repository", str(tmp_path / "models")]
    with pytest.raises(huggingface.UnsupportedCheckpoint, match="resamples with PIL filter 0.*--bilinear-resize"):
        huggingface.main(args)
    assert not (tmp_path / "models" / "nearest" / "1").exists()
    assert huggingface.main([*args, "--bilinear-resize"]) == 0
    prep = read_manifest(tmp_path / "models" / "nearest" / "1")["preprocessing"]
    assert prep["resize"] == "bilinear" and prep["imported_from"]["processor"]["resample"] == 0


def test_a_bicubic_resize_and_centre_crop_are_imported_as_the_processor_does_them(repository):
    prep = read_manifest(repository / "hf-deit-teacher" / "1")["preprocessing"]
    assert (prep["resize"], prep["resize_size"], prep["image_size"]) == ("bicubic", IMAGE_SIZE + 8, IMAGE_SIZE)
    assert "imported_from" not in prep  # reproduced, not approximated: the parity check covered the resize
    assert read_manifest(repository / "hf-vit" / "1")["preprocessing"]["resize"] == "bilinear"


def test_a_generation_setting_our_decoding_would_not_honour_is_refused_by_name(checkpoints, tmp_path):
    folder = tmp_path / "penalised"
    shutil.copytree(checkpoints / MARIAN, folder)
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps(generation | {"repetition_penalty": 1.2}))
    args = ["--model-dir", str(folder), "--name", "penalised", "--repository", str(tmp_path / "models")]
    with pytest.raises(huggingface.UnsupportedCheckpoint, match=r"does not reproduce: repetition_penalty=1\.2"):
        huggingface.main(args)
    assert not (tmp_path / "models" / "penalised" / "1").exists()
