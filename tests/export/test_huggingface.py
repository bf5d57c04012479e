"""Importing transformers checkpoints (python -m export.huggingface), served beside the shipped models.

The checkpoints are tiny, randomly initialised and built here from their configs (nothing is
downloaded); each is saved with ``save_pretrained``, imported, and then served by a real server next
to the shipped ``vit/1`` and ``translator/2``, and its answers are compared with what transformers
itself computes for the same input.
"""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from contract.manifest import load_entry, read_manifest
from export import huggingface
from service.attention.rollout import class_token_rollout
from tests.conftest import ROOT, run_module
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
        save_image_classifier(root / name, architecture)
    return root


@pytest.fixture(scope="module")
def repository(checkpoints, tmp_path_factory):
    """The shipped entries plus every imported checkpoint."""
    repo = tmp_path_factory.mktemp("hf-repo") / "models"
    for entry in (SHIPPED / "vit" / "1", SHIPPED / "translator" / "2"):
        shutil.copytree(entry, repo / entry.parent.name / entry.name)
    for name in IMAGE_MODELS:
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
    assert set(load_entry(repository / name / "1").manifest.files) == {"model.onnx", "model_attention.onnx"}


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


def test_an_unsupported_architecture_is_one_clear_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"], "model_type": "bert"}))
    proc = run_module("export.huggingface", "--model-dir", str(tmp_path), "--name", "b", "--repository", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: unsupported architecture 'BertForMaskedLM' (model_type 'bert'); supported: "
        + ", ".join(sorted(huggingface.IMPORTERS))
    ]


def test_a_processor_the_service_cannot_reproduce_is_refused_unless_accepted(tmp_path):
    folder = tmp_path / "bicubic"
    save_image_classifier(folder, "ViTForImageClassification", resample=3)
    args = ["--model-dir", str(folder), "--name", "bicubic", "--repository", str(tmp_path / "models")]
    with pytest.raises(huggingface.UnsupportedCheckpoint, match="resamples with PIL filter 3.*--bilinear-resize"):
        huggingface.main(args)
    assert not (tmp_path / "models" / "bicubic" / "1").exists()
    assert huggingface.main([*args, "--bilinear-resize"]) == 0
    prep = read_manifest(tmp_path / "models" / "bicubic" / "1")["preprocessing"]
    assert prep["resize"] == "bilinear" and prep["imported_from"]["processor"]["resample"] == 3
