"""Graph surgery shared by the exporters: a copy of an ONNX graph that computes only some outputs.

onnxruntime runs every node of a graph whatever outputs a caller fetches, so attention outputs
that are stacked for export cost time (copies of every layer's probabilities) even when unused.
The serving graphs therefore carry only what serving needs; attention lives in separate graphs.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx.utils


def keep_outputs(source: Path, target: Path, outputs: list[str]) -> None:
    """Write to ``target`` the subgraph of ``source`` that computes ``outputs`` from all its inputs."""
    model = onnx.load(str(source))
    names = {o.name for o in model.graph.output}
    if not set(outputs) <= names:
        raise ValueError(f"{source} has no outputs {sorted(set(outputs) - names)}")
    inputs = [i.name for i in model.graph.input]
    onnx.save(onnx.utils.Extractor(model).extract_model(inputs, outputs), str(target))
