"""Pieces every exporter shares: ORT sessions for checking, parity reports, atomic entry writing."""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from typing_extensions import Self

from contract.manifest import SCHEMA_VERSION, describe_files, write_manifest
from model.cli import CliError


class ExportError(CliError):
    """Export produced something we refuse to ship (parity drift, bad graph); the CLI exits non-zero."""


class UnsupportedCheckpoint(ExportError):
    """An imported checkpoint holds a model or a setting that no entry could serve the same way."""


def cpu_session(path: Path) -> ort.InferenceSession:
    """The same kind of session the service builds on a CPU (full graph optimisation)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        raise ExportError(f"shape mismatch: ONNX {a.shape} vs PyTorch {b.shape}")
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


def graph_io(path: Path) -> dict:
    """Input/output names, dtypes and (symbolic) shapes, read back from the saved graph, and the file
    beside it that holds its external data (``weights``), if it has any."""
    model = onnx.load(str(path), load_external_data=False)
    locations = {
        e.value
        for t in model.graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
        for e in t.external_data
        if e.key == "location"
    }
    if len(locations) > 1:
        raise ExportError(f"{path} keeps its weights in {len(locations)} files {sorted(locations)}, not one")

    def describe(values) -> list[dict]:
        out = []
        for v in values:
            t = v.type.tensor_type
            shape = [d.dim_param or d.dim_value for d in t.shape.dim]
            out.append(
                {"name": v.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name, "shape": shape}
            )
        return out

    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    io = {"inputs": describe(model.graph.input), "outputs": describe(model.graph.output), "opset": opset}
    return {**io, "weights": locations.pop()} if locations else io


def next_version(repository: Path, name: str) -> str:
    existing = [int(p.name) for p in (repository / name).glob("*") if p.is_dir() and p.name.isdigit()]
    return str(max(existing, default=0) + 1)


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def framework_versions(opset: int) -> dict:
    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": ort.__version__, "opset": opset}


class StagedEntry:
    """Build an entry in a temporary folder and move it into place only when everything passed."""

    def __init__(self, repository: Path, name: str, version: str, force: bool) -> None:
        self.final = Path(repository) / name / version
        if self.final.exists() and not force:
            raise ExportError(f"{self.final} already exists (pass --force to replace it)")
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f".{name}-{version}-", dir=self.final.parent))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:  # anything failed (parity, Ctrl-C): nothing half-written stays behind
            self.abort()

    def commit(self, manifest: dict) -> Path:
        files = sorted(p.name for p in self.dir.iterdir() if p.is_file())
        manifest = {"schema_version": SCHEMA_VERSION, **manifest, "files": describe_files(self.dir, files)}
        write_manifest(self.dir, manifest)
        self.dir.chmod(0o755)  # mkdtemp made it private; a repository entry is for everyone to read
        if self.final.exists():
            shutil.rmtree(self.final)
        self.dir.replace(self.final)
        return self.final

    def abort(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
