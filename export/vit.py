"""Export a trained ViT checkpoint to a model-repository entry ``models/vit/<version>/``.

``python -m export.vit --checkpoint checkpoints/vit-default/best.pt``

Two graphs with input ``pixel_values`` (B, C, H, W) float32: ``model_attention.onnx`` with outputs
``logits`` (B, classes) and ``attentions`` (B, layers, heads, tokens, tokens), and ``model.onnx``, the
serving graph cut from it with ``logits`` only. They are the same network, so its parameters are
stored once, in ``weights.bin``, which both point into. The export is checked against PyTorch on real
test images at batch sizes 1, 8 and 64 and refused if it drifts; the test accuracy recorded in the
manifest is measured on the exported graph itself, through onnxruntime.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from contract.manifest import Preprocessing
from export.common import (
    ExportError,
    StagedEntry,
    cpu_session,
    framework_versions,
    graph_io,
    max_abs_diff,
    next_version,
    now_iso,
)
from export.graphs import keep_outputs
from export.samples import write_samples
from export.shared_weights import share_weights
from model.cli import CliError, run_cli
from model.data import load_image_dataset
from model.training import load_checkpoint
from model.vit import ViT, ViTConfig

INPUT, LOGITS, ATTENTIONS = "pixel_values", "logits", "attentions"
PARITY_BATCHES = (1, 8, 64)
LOGITS_TOL, ATTENTION_TOL = 1e-4, 1e-5


class ViTWithAttention(nn.Module):
    """The exported signature: images -> (logits, every layer's attention probabilities)."""

    def __init__(self, vit: ViT) -> None:
        super().__init__()
        self.vit = vit

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.vit(pixel_values, return_attention=True)


def write_classifier_graphs(
    module: nn.Module, channels: int, image_size: int, folder: Path, opset: int = 18
) -> tuple[Path, Path]:
    """``model_attention.onnx`` from ``module`` (see ``export_image_graph``) and ``model.onnx`` cut from it
    with the logits only (what serving runs unless attention is asked for), their parameters stored once
    in ``weights.bin``: (serving graph, attention graph)."""
    graph, attention_graph = folder / "model.onnx", folder / "model_attention.onnx"
    export_image_graph(module, channels, image_size, attention_graph, opset)
    keep_outputs(attention_graph, graph, [LOGITS])
    share_weights(folder, [graph.name, attention_graph.name])
    return graph, attention_graph


def export_image_graph(module: nn.Module, channels: int, image_size: int, path: Path, opset: int = 18) -> None:
    """A module mapping pixel_values (batch, C, H, W) to (logits, attentions), with a dynamic batch axis."""
    example = torch.zeros(2, channels, image_size, image_size)
    batch = torch.export.Dim("batch", min=1, max=4096)
    torch.onnx.export(
        module.eval(),
        (example,),
        dynamo=True,
        opset_version=opset,
        input_names=[INPUT],
        output_names=[LOGITS, ATTENTIONS],
        dynamic_shapes={"pixel_values": {0: batch}},
        external_data=False,
    ).save(str(path))


@torch.no_grad()
def parity_report(vit: ViT, session, x: np.ndarray, batch_sizes=PARITY_BATCHES, logits_only=None) -> dict:
    """Max |ONNX - PyTorch| of logits and attention, and argmax agreement, at each batch size; with
    ``logits_only`` (the serving graph), its logits are held to the same tolerance."""
    report = {
        "batch_sizes": list(batch_sizes),
        "max_abs_logits": 0.0,
        "max_abs_attention": 0.0,
        "argmax_identical": True,
    }
    if not len(x):
        raise ExportError("no test images for the parity check")
    for bs in batch_sizes:
        xb = x[np.arange(bs) % len(x)]  # a small test split is repeated to fill the batch
        logits, attn = vit(torch.from_numpy(xb), return_attention=True)
        o_logits, o_attn = session.run([LOGITS, ATTENTIONS], {INPUT: xb})
        report["max_abs_logits"] = max(report["max_abs_logits"], max_abs_diff(o_logits, logits.numpy()))
        report["max_abs_attention"] = max(report["max_abs_attention"], max_abs_diff(o_attn, attn.numpy()))
        report["argmax_identical"] &= bool((o_logits.argmax(-1) == logits.numpy().argmax(-1)).all())
        if logits_only is not None:
            (s_logits,) = logits_only.run([LOGITS], {INPUT: xb})
            report["max_abs_logits"] = max(report["max_abs_logits"], max_abs_diff(s_logits, logits.numpy()))
            report["argmax_identical"] &= bool((s_logits.argmax(-1) == logits.numpy().argmax(-1)).all())
    return report


def parity_problems(
    report: dict, reference: str, logits_tol: float = LOGITS_TOL, attention_tol: float = ATTENTION_TOL
) -> list[str]:
    """What an image classifier's parity report exceeds, against ``reference`` (PyTorch, transformers)."""
    problems = []
    if report["max_abs_logits"] > logits_tol:
        problems.append(f"max |dlogits| {report['max_abs_logits']:.2e} > {logits_tol:.0e}")
    if report["max_abs_attention"] > attention_tol:
        problems.append(f"max |dattention| {report['max_abs_attention']:.2e} > {attention_tol:.0e}")
    if not report["argmax_identical"]:
        problems.append(f"argmax differs from {reference}")
    return problems


def check_parity(report: dict, logits_tol: float = LOGITS_TOL, attention_tol: float = ATTENTION_TOL) -> None:
    if problems := parity_problems(report, "PyTorch", logits_tol, attention_tol):
        raise ExportError("ONNX/PyTorch parity check failed: " + "; ".join(problems))


def onnx_accuracy(session, x: np.ndarray, y: np.ndarray, batch_size: int = 500, progress: bool = True) -> float:
    correct = 0
    for i in tqdm(range(0, len(x), batch_size), desc="test accuracy (onnxruntime)", disable=not progress, leave=False):
        (logits,) = session.run([LOGITS], {INPUT: x[i : i + batch_size]})
        correct += int((logits.argmax(-1) == y[i : i + batch_size]).sum())
    return correct / len(x)


def build_manifest(ckpt: dict, name: str, version: str, io: dict, attention_io: dict, evaluation: dict) -> dict:
    cfg = ViTConfig.from_dict(ckpt["config"])
    return {
        "name": name,
        "version": version,
        "task": "image-classification",
        "created_at": now_iso(),
        "framework": framework_versions(io["opset"]),
        "model": {"architecture": "ViT", "config": cfg.to_dict(), "parameters": ViT(cfg).num_parameters()},
        "graphs": {
            "model": {"file": "model.onnx", **io},
            "attention": {"file": "model_attention.onnx", **attention_io},
        },
        "labels": ckpt["label_names"],
        "preprocessing": ckpt["preprocessing"],
        "io": {"images": INPUT, "logits": LOGITS},
        "attention": {
            "graph": "attention",
            "output": ATTENTIONS,
            "layout": ["batch", "layer", "head", "query", "key"],
            "layers": cfg.depth,
            "heads": cfg.heads,
            "tokens": cfg.num_tokens,
            "prefix_tokens": 1,
            "grid": [cfg.grid_size, cfg.grid_size],
            "patch_size": cfg.patch_size,
        },
        "evaluation": evaluation,
        "training": ckpt["training"],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m export.vit", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, default=Path("checkpoints/vit-default/best.pt"))
    p.add_argument("--repository", type=Path, default=Path("models"))
    p.add_argument("--name", default="vit")
    p.add_argument("--version", help="default: one more than the highest existing version")
    p.add_argument("--force", action="store_true", help="replace an existing version")
    p.add_argument("--opset", type=int, default=18)
    p.add_argument("--data-dir", type=Path, help="dataset location, if not the default one")
    p.add_argument("--int8", action="store_true", help="also write <name>-int8: dynamic int8 quantisation")
    p.add_argument(
        "--int8-max-loss",
        type=float,
        default=0.3,
        metavar="POINTS",
        help="refuse the int8 variant if its test accuracy is more points below fp32's (default: %(default)s)",
    )
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.opset < 17:
        raise CliError(f"opset must be >= 17, got {args.opset}")
    ckpt = load_checkpoint(args.checkpoint)
    if "config" not in ckpt:
        raise CliError(f"{args.checkpoint} has no training metadata (an interrupted run?); train again")
    vit = ViT(ViTConfig.from_dict(ckpt["config"])).eval()
    vit.load_state_dict(ckpt["state_dict"])
    data = _test_data(ckpt, args.data_dir)
    x_test = Preprocessing.model_validate(ckpt["preprocessing"]).apply(data.test_images)
    version = args.version or next_version(args.repository, args.name)

    with StagedEntry(args.repository, args.name, version, args.force) as stage:
        print(f"exporting {args.checkpoint} -> {stage.final}", file=sys.stderr)
        cfg = vit.cfg
        graph, attention_graph = write_classifier_graphs(
            ViTWithAttention(vit), cfg.channels, cfg.image_size, stage.dir, args.opset
        )
        session = cpu_session(graph)
        parity = parity_report(vit, cpu_session(attention_graph), x_test, logits_only=session)
        check_parity(parity)
        accuracy = onnx_accuracy(session, x_test, data.test_labels, progress=not args.no_progress)
        evaluation = {
            "dataset": data.name,
            "split": "test",
            "test_examples": len(x_test),
            "test_accuracy": accuracy,
            "pytorch_test_accuracy": ckpt["evaluation"]["test_accuracy"],
            "parity": {**parity, "logits_tolerance": LOGITS_TOL, "attention_tolerance": ATTENTION_TOL},
        }
        manifest = build_manifest(ckpt, args.name, version, graph_io(graph), graph_io(attention_graph), evaluation)
        manifest["samples"] = write_samples(stage.dir, data.test_images, data.test_labels, manifest["labels"])
        final = stage.commit(manifest)
    print(
        f"wrote {final}: test accuracy {accuracy:.4f}, parity max |dlogits| {parity['max_abs_logits']:.1e}, "
        f"max |dattention| {parity['max_abs_attention']:.1e}",
        file=sys.stderr,
    )
    if args.int8:
        from export.quantize import export_int8

        out = args.repository / f"{args.name}-int8" / version
        export_int8(final, out, args.force, x_test, data.test_labels, args.int8_max_loss / 100)
    return 0


def _test_data(ckpt: dict, data_dir: Path | None):
    """The dataset the checkpoint was trained on, read the same way (for its test split)."""
    name = ckpt["training"]["dataset"]["dataset"]
    if name != "image-folder":
        return load_image_dataset(name, data_dir)
    cfg = ckpt["config"]
    root = data_dir or Path(ckpt["training"]["dataset"]["path"])
    return load_image_dataset(name, root, image_size=cfg["image_size"], channels=cfg["channels"])


if __name__ == "__main__":
    run_cli(main)
