"""Checks of an image classifier entry's layout: both graphs point into one weights file, each tensor stored once."""

from __future__ import annotations

from pathlib import Path

import onnx

from contract.manifest import load_entry
from export.shared_weights import MIN_BYTES, WEIGHTS


def external_tensors(graph: Path) -> dict[str, tuple[str, int, int]]:
    """The graph's external initializers, name -> (file, offset, length); only tensors under 1 KiB stay
    inline (what else a graph file holds is its structure, whose size does not grow with the model's)."""
    model = onnx.load(str(graph), load_external_data=False)
    external = {}
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            external[t.name] = (info["location"], int(info["offset"]), int(info["length"]))
        else:
            assert len(t.raw_data) < MIN_BYTES, f"{graph.name}: {t.name} ({len(t.raw_data)} bytes) kept inline"
    return external


def assert_classifier_weights_stored_once(entry_dir: Path) -> None:
    entry = load_entry(entry_dir)  # the sha256 of weights.bin is checked with the others
    graphs = entry.manifest.graphs
    assert WEIGHTS in entry.manifest.files
    assert graphs["model"].weights == graphs["attention"].weights == WEIGHTS
    serving = external_tensors(entry_dir / graphs["model"].file)
    attention = external_tensors(entry_dir / graphs["attention"].file)
    assert serving and {loc for loc, _, _ in (*serving.values(), *attention.values())} == {WEIGHTS}
    # the serving graph is cut from the attention graph: every one of its parameters is one of the attention
    # graph's, at the same place in the file
    assert set(serving.values()) <= set(attention.values())
    stored = sum(length for _, _, length in set(attention.values()))
    assert stored <= (entry_dir / WEIGHTS).stat().st_size < stored + 64 * len(attention)  # each once, aligned
