"""Import a Hugging Face ``transformers`` checkpoint folder as a model-repository entry.

``python -m export.huggingface --model-dir DIR --name NAME [--version N] --repository models``

``DIR`` is what ``save_pretrained`` wrote (``config.json``, safetensors or bin weights, the image
processor's or the tokenizer's files); nothing else is read and the network is never touched. The
entry is the one our own exporters write, so the unchanged service serves it with everything it has:

- ``ViTForImageClassification``, ``DeiTForImageClassification`` and
  ``DeiTForImageClassificationWithTeacher`` (logits as transformers computes them: the class token's
  head, or for the teacher variant the mean of the class and distillation heads): ``model.onnx``
  (logits only) and ``model_attention.onnx`` (logits and every layer's attention), their parameters
  stored once in ``weights.bin``, labels from ``id2label``, preprocessing from ``preprocessor_config.json``, and the attention section with the
  prefix tokens (1 for ViT; 2 for DeiT, its class and distillation tokens) that rollout skips;
- ``MarianMTModel``: ``encoder.onnx``, ``decoder.onnx`` (one step against our per-layer key/value
  buffers) and ``decoder_prefix.onnx`` computed from the checkpoint's weights with Marian's own
  positions and embedding scale, plus ``source.spm``, ``target.spm`` and ``vocab.json`` described by
  the manifest as a SentencePiece pair with a vocabulary mapping (``contract/tokenizer.py``).

Parity with transformers itself is part of the import, and nothing is written unless it passes: the
logits and every attention map (``output_attentions=True``) of every graph; for Marian, greedy
decoding through onnxruntime token for token against ``generate(num_beams=1, do_sample=False)`` on
real sentences, our tokenisation against ``MarianTokenizer``, and beam search against
``generate(num_beams=4)`` (measured and explained, not required to agree: see docs/import.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from contract.images import resize_image
from contract.manifest import Preprocessing
from export.common import (
    ExportError,
    StagedEntry,
    UnsupportedCheckpoint,
    cpu_session,
    framework_versions,
    graph_io,
    max_abs_diff,
    next_version,
    now_iso,
)
from export.vit import (
    ATTENTION_TOL,
    ATTENTIONS,
    INPUT,
    LOGITS,
    LOGITS_TOL,
    parity_problems,
    write_classifier_graphs,
)
from model.cli import CliError, run_cli

# Only the local folder: transformers must not look anything up on the Hub (set before it is imported).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PREPROCESSING_TOL = 1e-5
PARITY_BATCHES = (1, 4)
PIL_BILINEAR = 2  # PIL.Image.Resampling.BILINEAR, as transformers' image processors record ``resample``
RESIZE_FILTERS = {2: "bilinear", 3: "bicubic"}  # PIL filter ids -> the manifest's resize (contract/images.py)


@dataclass(frozen=True)
class Checkpoint:
    folder: Path
    architecture: str
    config: dict  # config.json as saved


def read_checkpoint(folder: Path) -> Checkpoint:
    """The folder's ``config.json`` and the one architecture it names; one clear error otherwise."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CliError(f"{folder}: no config.json (pass the folder save_pretrained wrote)")
    config = json.loads(path.read_text(encoding="utf-8"))
    architectures = config.get("architectures") or []
    if len(architectures) != 1:
        raise UnsupportedCheckpoint(f"{path}: names architectures {architectures}, expected exactly one")
    architecture = architectures[0]
    if architecture not in IMPORTERS:
        raise UnsupportedCheckpoint(
            f"unsupported architecture {architecture!r} (model_type {config.get('model_type')!r}); "
            f"supported: {', '.join(sorted(IMPORTERS))}"
        )
    return Checkpoint(Path(folder), architecture, config)


def load_model(ckpt: Checkpoint) -> nn.Module:
    """The checkpoint's model class from transformers, eager attention (the only one that returns its maps)."""
    import transformers

    cls = getattr(transformers, ckpt.architecture)
    return cls.from_pretrained(ckpt.folder, attn_implementation="eager", local_files_only=True).eval()


def source_section(ckpt: Checkpoint) -> dict:
    """Where the entry came from: the manifest's ``model`` section."""
    import transformers

    weights = sorted(p.name for p in ckpt.folder.iterdir() if p.suffix in (".safetensors", ".bin"))
    return {
        "architecture": ckpt.architecture,
        "config": ckpt.config,
        "source": {"library": "transformers", "folder": str(ckpt.folder), "weights": weights},
        "transformers": transformers.__version__,
    }


# --- image classification: ViT, DeiT ---------------------------------------------------------------

# Tokens before the patches, per architecture: what rollout and the heatmaps skip.
PREFIX_TOKENS = {
    "ViTForImageClassification": 1,  # [CLS]
    "DeiTForImageClassification": 2,  # [CLS], distillation (the logits are the [CLS] head's)
    "DeiTForImageClassificationWithTeacher": 2,  # the logits are the mean of both heads
}


class ImageClassifierGraph(nn.Module):
    """transformers' own forward, as the exported signature: images -> (logits, (B, layer, head, T, T))."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(pixel_values=pixel_values, output_attentions=True)
        return out.logits, torch.stack(out.attentions, dim=1)  # (B, L, H, T, T)


def image_preprocessing(ckpt: Checkpoint, bilinear_resize: bool) -> tuple[dict, dict]:
    """The manifest's ``preprocessing`` from ``preprocessor_config.json``, and the processor's config.

    The service resizes bilinearly straight to the model's size; a processor that resamples otherwise
    or crops is refused unless ``bilinear_resize`` accepts the service's resize (then recorded)."""
    path = ckpt.folder / "preprocessor_config.json"
    if not path.is_file():
        raise CliError(f"{ckpt.folder}: no preprocessor_config.json (save the image processor with the model)")
    proc = json.loads(path.read_text(encoding="utf-8"))
    size, channels = int(ckpt.config["image_size"]), int(ckpt.config.get("num_channels", 3))
    if channels not in (1, 3):
        raise UnsupportedCheckpoint(f"{ckpt.architecture} with {channels} channels: only 1 (L) or 3 (RGB)")
    problems = []
    target = proc.get("size", {}) if proc.get("do_resize", True) else {"height": size, "width": size}
    if isinstance(target, int):
        target = {"height": target, "width": target}
    crop = proc.get("crop_size") if proc.get("do_center_crop") else None
    if isinstance(crop, int):
        crop = {"height": crop, "width": crop}
    resize_size = target.get("height")
    if target.get("height") != target.get("width") or "shortest_edge" in target:
        problems.append(f"it resizes to {target}, not to a square (the service resizes to a square)")
    if crop is not None and crop != {"height": size, "width": size}:
        problems.append(f"it center-crops to {crop}, not to the model's {size}x{size}")
    elif crop is None and resize_size != size:
        problems.append(f"it resizes to {target} without a crop, not to the model's {size}x{size}")
    elif resize_size is not None and resize_size < size:
        problems.append(f"it resizes to {target}, smaller than the {size}x{size} crop")
    resample = proc.get("resample", PIL_BILINEAR) if proc.get("do_resize", True) else PIL_BILINEAR
    if resample not in RESIZE_FILTERS:
        problems.append(f"it resamples with PIL filter {resample}; the service has {sorted(RESIZE_FILTERS.values())}")
    if not proc.get("do_resize", True):
        problems.append("it does not resize (the service resizes every image to the model's size)")
    if problems and not bilinear_resize:
        raise UnsupportedCheckpoint(
            f"{path}: {'; '.join(problems)}. Pass --bilinear-resize to import it with a bilinear resize straight "
            f"to {size}x{size}"
        )

    def per_channel(value, default: float) -> list[float]:
        values = [float(v) for v in (value if isinstance(value, list | tuple) else [value])] if value else [default]
        values = values * channels if len(values) == 1 else values
        if len(values) != channels:
            raise UnsupportedCheckpoint(f"{path}: {len(values)} means/stds for a {channels}-channel model")
        return values

    normalize = proc.get("do_normalize", True)
    prep = {
        "image_size": size,
        "channels": channels,
        "color_mode": "RGB" if channels == 3 else "L",
        "resize": "bilinear" if problems else RESIZE_FILTERS[resample],
        **({"resize_size": resize_size} if not problems and resize_size != size else {}),
        "scale": float(proc.get("rescale_factor", 1 / 255)) if proc.get("do_rescale", True) else 1.0,
        "mean": per_channel(proc.get("image_mean"), 0.0) if normalize else [0.0] * channels,
        "std": per_channel(proc.get("image_std"), 1.0) if normalize else [1.0] * channels,
    }
    if problems:
        prep["imported_from"] = {"processor": proc, "differences": problems}
    Preprocessing.model_validate(prep)
    return prep, proc


def parity_images(prep: dict, count: int = 8, seed: int = 0) -> np.ndarray:
    """uint8 (N, H, W, C) images at the model's size: smooth gradients plus noise, reproducible."""
    rng = np.random.default_rng(seed)
    size, channels = prep["image_size"], prep["channels"]
    ramp = np.linspace(0, 255, size)
    base = (ramp[None, :, None] + ramp[:, None, None]) / 2
    noise = rng.normal(0, 40, (count, size, size, channels))
    return np.clip(base[None] + noise, 0, 255).astype(np.uint8)


@torch.no_grad()
def image_parity(model: nn.Module, attention_session, session, x: np.ndarray, batches=PARITY_BATCHES) -> dict:
    """Max |onnxruntime - transformers| of the logits (both graphs) and of every attention map."""
    report = {"batch_sizes": list(batches), "max_abs_logits": 0.0, "max_abs_attention": 0.0, "argmax_identical": True}
    for bs in batches:
        xb = x[np.arange(bs) % len(x)]
        ref = model(pixel_values=torch.from_numpy(xb), output_attentions=True)
        ref_logits, ref_attn = ref.logits.numpy(), torch.stack(ref.attentions, dim=1).numpy()
        logits, attn = attention_session.run([LOGITS, ATTENTIONS], {INPUT: xb})
        (serving,) = session.run([LOGITS], {INPUT: xb})
        for got in (logits, serving):
            report["max_abs_logits"] = max(report["max_abs_logits"], max_abs_diff(got, ref_logits))
            report["argmax_identical"] &= bool((got.argmax(-1) == ref_logits.argmax(-1)).all())
        report["max_abs_attention"] = max(report["max_abs_attention"], max_abs_diff(attn, ref_attn))
    return report


def preprocessing_parity(ckpt: Checkpoint, prep: dict, images: np.ndarray) -> float:
    """Max |our resize and normalisation - the checkpoint's image processor| on images of another size."""
    from PIL import Image
    from transformers import AutoImageProcessor

    # the slow processor is the Pillow one, the reference the service's resize (contract/images.py) follows
    processor = AutoImageProcessor.from_pretrained(ckpt.folder, local_files_only=True, use_fast=False)
    p = Preprocessing.model_validate(prep)
    pil = [Image.fromarray(im[..., 0] if prep["channels"] == 1 else im, prep["color_mode"]) for im in images]
    theirs = np.asarray(processor(images=pil, return_tensors="np")["pixel_values"], dtype=np.float32)
    resized = [np.asarray(resize_image(im, p.image_size, p.resize, p.resize_size), np.uint8) for im in pil]
    ours = p.apply(np.stack([r.reshape(p.image_size, p.image_size, -1) for r in resized]))
    return max_abs_diff(ours, theirs)


def check_image_parity(report: dict) -> None:
    problems = parity_problems(report, "transformers")
    if report.get("preprocessing_max_abs") is not None and report["preprocessing_max_abs"] > PREPROCESSING_TOL:
        problems.append(
            f"preprocessing differs from the image processor by {report['preprocessing_max_abs']:.2e} "
            f"> {PREPROCESSING_TOL:.0e}"
        )
    if problems:
        raise ExportError("parity with transformers failed: " + "; ".join(problems))


def import_image_classifier(ckpt: Checkpoint, stage: StagedEntry, args: argparse.Namespace) -> tuple[dict, str]:
    prep, _ = image_preprocessing(ckpt, args.bilinear_resize)
    model = load_model(ckpt)
    cfg = model.config
    labels = [str(cfg.id2label[i]) for i in range(cfg.num_labels)]
    graph, attention_graph = write_classifier_graphs(
        ImageClassifierGraph(model), prep["channels"], prep["image_size"], stage.dir, args.opset
    )
    images = parity_images(prep)
    x = Preprocessing.model_validate(prep).apply(images)
    report = image_parity(model, cpu_session(attention_graph), cpu_session(graph), x)
    odd = parity_images({**prep, "image_size": prep["image_size"] + 37})  # every image goes through the resize
    report["preprocessing_max_abs"] = None if "imported_from" in prep else preprocessing_parity(ckpt, prep, odd)
    check_image_parity(report)
    attention_io = graph_io(attention_graph)
    tokens = attention_io["outputs"][1]["shape"][-1]
    grid = prep["image_size"] // cfg.patch_size
    prefix = PREFIX_TOKENS[ckpt.architecture]
    if tokens != prefix + grid * grid:
        raise ExportError(f"{tokens} attention tokens are not {prefix} prefix tokens + a {grid}x{grid} grid")
    io = graph_io(graph)
    manifest = {
        "name": stage.final.parent.name,
        "version": stage.final.name,
        "task": "image-classification",
        "created_at": now_iso(),
        "framework": framework_versions(io["opset"]),
        "model": {**source_section(ckpt), "parameters": sum(p.numel() for p in model.parameters())},
        "graphs": {
            "model": {"file": graph.name, **io},
            "attention": {"file": attention_graph.name, **attention_io},
        },
        "labels": labels,
        "preprocessing": prep,
        "io": {"images": INPUT, "logits": LOGITS},
        "attention": {
            "graph": "attention",
            "output": ATTENTIONS,
            "layout": ["batch", "layer", "head", "query", "key"],
            "layers": cfg.num_hidden_layers,
            "heads": cfg.num_attention_heads,
            "tokens": tokens,
            "prefix_tokens": prefix,
            "grid": [grid, grid],
            "patch_size": cfg.patch_size,
        },
        "evaluation": {
            "parity": {
                **report,
                "against": "transformers",
                "images": len(images),
                "logits_tolerance": LOGITS_TOL,
                "attention_tolerance": ATTENTION_TOL,
                "preprocessing_tolerance": PREPROCESSING_TOL,
            }
        },
    }
    summary = f"parity max |dlogits| {report['max_abs_logits']:.1e}, max |dattention| {report['max_abs_attention']:.1e}"
    return manifest, summary


# --- translation: Marian ---------------------------------------------------------------------------

MARIAN_FILES = ("source.spm", "target.spm", "vocab.json")  # MarianTokenizer's, copied as they are
# Real sentences for the parity check when --sentences is not given (the source language of OPUS-MT
# en-* models); a checkpoint of another source language should pass its own.
PARITY_SENTENCES = [
    "Saves the current document.",
    "Open the file.",
    "Select the cells you want to format.",
    "Where is the nearest train station?",
    "The weather is nice today.",
    "Click the button to close the dialog.",
    "Prints the active sheet.",
    "I would like a cup of coffee.",
    "The file could not be saved because the disk is full.",
    "Do you want to keep the changes?",
    "She has been living in Berlin for three years.",
    "Press Enter to continue.",
    "My brother plays the guitar every evening.",
    "Insert a new row above the selected row.",
    "How much does this book cost?",
    "The children are playing in the garden.",
]


def import_translator(ckpt: Checkpoint, stage: StagedEntry, args: argparse.Namespace) -> tuple[dict, str]:
    import shutil

    from transformers import MarianTokenizer

    from contract.decoding import DecoderSpec, session_fn
    from contract.manifest import TokenizerSpec
    from contract.tokenizer import load_tokenizer
    from export import marian

    folder = ckpt.folder
    missing = [f for f in MARIAN_FILES if not (folder / f).is_file()]
    if missing:
        raise CliError(f"{folder}: no {', '.join(missing)} (save the MarianTokenizer with the model)")
    tok_config_path = folder / "tokenizer_config.json"
    tok_config = json.loads(tok_config_path.read_text(encoding="utf-8")) if tok_config_path.is_file() else {}
    if tok_config.get("separate_vocabs"):
        raise UnsupportedCheckpoint(f"{folder}: MarianMTModel with separate source and target vocabularies")
    model = load_model(ckpt)
    cfg = model.config
    gen = marian.generation_settings(folder, cfg)
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    if not (len(vocab) == cfg.vocab_size == cfg.decoder_vocab_size):
        raise UnsupportedCheckpoint(
            f"{folder}: vocab.json holds {len(vocab)} pieces, the model {cfg.vocab_size} / {cfg.decoder_vocab_size}"
        )
    special = {"pad": gen.pad, "eos": gen.eos, "unk": vocab[tok_config.get("unk_token", "<unk>")]}
    special["decoder_start"] = gen.decoder_start
    tokenizer_section = {
        "library": "sentencepiece-pair",
        "source_file": "source.spm",
        "target_file": "target.spm",
        "vocab_file": "vocab.json",
        "special_ids": special,
        "vocab_size": len(vocab),
        "normalization": None,
    }
    for name in MARIAN_FILES:
        shutil.copyfile(folder / name, stage.dir / name)
    marian.export_graphs(model, gen.suppressed, stage.dir, args.opset)
    tokenizer = load_tokenizer(stage.dir, TokenizerSpec.model_validate(tokenizer_section))
    hf_tokenizer = MarianTokenizer.from_pretrained(folder, local_files_only=True)
    heads = cfg.decoder_attention_heads
    spec = DecoderSpec(
        cfg.decoder_layers,
        heads,
        cfg.d_model // heads,
        gen.pad,
        gen.decoder_start,
        gen.eos,
        cfg.max_position_embeddings,
    )
    graphs = {g: session_fn(cpu_session(stage.dir / f"{g}.onnx")) for g in ("encoder", "decoder", "decoder_prefix")}
    sentences = PARITY_SENTENCES
    if args.sentences:
        sentences = [s for s in args.sentences.read_text(encoding="utf-8").splitlines() if s.strip()]
    report = marian.parity_report(model, hf_tokenizer, tokenizer, graphs, sentences, spec, gen, beam=4)
    marian.check_parity(report)
    io = {g: graph_io(stage.dir / f"{g}.onnx") for g in ("encoder", "decoder", "decoder_prefix")}
    languages = {k: tok_config[f"{k}_lang"] for k in ("source", "target") if tok_config.get(f"{k}_lang")}
    manifest = {
        "name": stage.final.parent.name,
        "version": stage.final.name,
        "task": "translation",
        "created_at": now_iso(),
        "framework": framework_versions(io["encoder"]["opset"]),
        **({"languages": languages} if len(languages) == 2 else {}),
        "model": {**source_section(ckpt), "parameters": sum(p.numel() for p in model.parameters())},
        "graphs": {g: {"file": f"{g}.onnx", **graph_io} for g, graph_io in io.items()},
        "tokenizer": tokenizer_section,
        "decoding": {
            "cache_layout": ["batch", "head", "position", "head_dim"],
            "cache_inputs": "past_keys_{layer}",
            "cache_outputs": "new_keys_{layer}",
            "cache": "buffer: the caller writes each step's new keys/values",
            "layers": spec.layers,
            "heads": spec.heads,
            "head_dim": spec.head_dim,
            "max_positions": spec.max_positions,
            "max_length": "min(max_positions, 1.5 * source_tokens + 10)",
            "beam": gen.beam,
            "length_penalty": gen.length_penalty,
            "scores": "log_probs",
            "suppressed_ids": gen.suppressed,  # -inf in the graphs' log_probs: generate() never produces them
            "positions": "sinusoidal from 0, Marian's layout (sines then cosines), inside the graphs",
            "embedding_scale": float(model.model.decoder.embed_scale),
        },
        "attention": {
            "encoder": {
                "output": "encoder_attentions",
                "layout": ["batch", "layer", "head", "query", "key"],
                "layers": cfg.encoder_layers,
                "heads": cfg.encoder_attention_heads,
            },
            "prefix": {
                "graph": "decoder_prefix",
                "self": ["batch", "layer", "head", "target", "target"],
                "cross": ["batch", "layer", "head", "target", "source"],
            },
            "heads": heads,
        },
        "evaluation": {
            "parity": {
                **report,
                "against": "transformers",
                "log_probs_tolerance": marian.LOG_PROB_TOL,
                "attention_tolerance": marian.ATTENTION_TOL,
            }
        },
    }
    b = report["beam"]
    summary = (
        f"parity: {report['identical_tokens'] + report['identical_but_forced_eos']}/{report['sentences']} greedy "
        f"outputs identical to generate(), max |dlog_probs| {report['max_abs_log_probs']:.1e}, max |dattention| "
        f"{report['max_abs_attention']:.1e}; beam {b['beam']}: {b['checkpoint']['identical']}/{report['sentences']} "
        f"identical (early_stopping={b['early_stopping']}), {b['early_stopping_true']['identical']} with early_stopping=True"
    )
    return manifest, summary


# --- the command line ------------------------------------------------------------------------------

Importer = Callable[[Checkpoint, StagedEntry, argparse.Namespace], tuple[dict, str]]
IMPORTERS: dict[str, Importer] = {
    "ViTForImageClassification": import_image_classifier,
    "DeiTForImageClassification": import_image_classifier,
    "DeiTForImageClassificationWithTeacher": import_image_classifier,
    "MarianMTModel": import_translator,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m export.huggingface", description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, required=True, help="the folder save_pretrained wrote")
    p.add_argument("--name", required=True, help="the model's name in the repository")
    p.add_argument("--repository", type=Path, default=Path("models"))
    p.add_argument("--version", help="default: one more than the highest existing version")
    p.add_argument("--force", action="store_true", help="replace an existing version")
    p.add_argument("--opset", type=int, default=18)
    p.add_argument(
        "--bilinear-resize",
        action="store_true",
        help="image models: accept the service's bilinear resize to the model's size where the processor differs",
    )
    p.add_argument(
        "--sentences",
        type=Path,
        help="translation models: a file of real source sentences, one a line, for the parity check "
        "(default: 16 English sentences)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.opset < 17:
        raise CliError(f"opset must be >= 17, got {args.opset}")
    if not args.model_dir.is_dir():
        raise CliError(f"--model-dir {args.model_dir} is not a folder")
    ckpt = read_checkpoint(args.model_dir)
    version = args.version or next_version(args.repository, args.name)
    with StagedEntry(args.repository, args.name, version, args.force) as stage:
        print(f"importing {ckpt.architecture} from {ckpt.folder} -> {stage.final}", file=sys.stderr)
        manifest, summary = IMPORTERS[ckpt.architecture](ckpt, stage, args)
        final = stage.commit(manifest)
    print(f"wrote {final}: {summary}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_cli(main)
