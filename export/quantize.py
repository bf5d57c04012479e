"""Optional int8 variant of an exported classifier: onnxruntime dynamic quantisation of MatMul weights.

It is written as its own entry (``<name>-int8/<version>``) with its own measured accuracy and its
agreement with the fp32 graph, so nobody ships it without seeing what it costs.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
from onnxruntime.quantization import QuantType, quantize_dynamic

from contract.manifest import read_manifest
from export.common import StagedEntry, cpu_session, max_abs_diff, now_iso

INPUT, LOGITS = "pixel_values", "logits"


def export_int8(
    fp32_entry: Path, repository: Path, name: str, version: str, force: bool, x_test: np.ndarray, y_test: np.ndarray
) -> Path:
    manifest = read_manifest(fp32_entry)
    with StagedEntry(repository, name, version, force) as stage:
        for graph in manifest["graphs"].values():  # the serving graph and the attention graph alike
            quantize_dynamic(
                str(fp32_entry / graph["file"]),
                str(stage.dir / graph["file"]),
                weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul", "Gemm"],
            )
        for sample in manifest.get("samples", []):
            shutil.copy(fp32_entry / sample["file"], stage.dir / sample["file"])
        src, dst = fp32_entry / "model.onnx", stage.dir / "model.onnx"
        fp32, int8 = cpu_session(src), cpu_session(dst)
        ref = np.concatenate([fp32.run([LOGITS], {INPUT: x_test[i : i + 500]})[0] for i in range(0, len(x_test), 500)])
        got = np.concatenate([int8.run([LOGITS], {INPUT: x_test[i : i + 500]})[0] for i in range(0, len(x_test), 500)])
        accuracy = float((got.argmax(-1) == y_test).mean())
        evaluation = {
            **manifest["evaluation"],
            "test_accuracy": accuracy,
            "fp32_test_accuracy": manifest["evaluation"]["test_accuracy"],
            "vs_fp32": {
                "max_abs_logits": max_abs_diff(got, ref),
                "argmax_agreement": float((got.argmax(-1) == ref.argmax(-1)).mean()),
            },
        }
        evaluation.pop("parity", None)
        new = {k: v for k, v in manifest.items() if k not in ("schema_version", "files")}
        new.update(
            name=name,
            version=version,
            created_at=now_iso(),
            evaluation=evaluation,
            variant={
                "precision": "int8",
                "method": "onnxruntime dynamic quantisation (MatMul/Gemm weights)",
                "from": f"{manifest['name']}/{manifest['version']}",
            },
        )
        final = stage.commit(new)
    size = (final / "model.onnx").stat().st_size
    fp32_accuracy = manifest["evaluation"]["test_accuracy"]
    print(
        f"wrote {final}: int8 test accuracy {accuracy:.4f} (fp32 {fp32_accuracy:.4f}), {size:,} bytes", file=sys.stderr
    )
    return final
