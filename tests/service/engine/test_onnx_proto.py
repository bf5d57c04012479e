"""The ONNX messages the service writes without the onnx package, read back and checked with it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from service.engine import cache_graphs
from service.engine.onnx_proto import model, node

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)


def test_a_node_reads_back_with_its_attributes_and_tensors():
    written = node("Op", ["a", "b"], ["c"], i=-3, f=0.5, s="x", ints=[1, -2, 1 << 40], t=np.arange(6.0).reshape(2, 3))
    n = onnx.NodeProto.FromString(written)
    assert (n.op_type, list(n.input), list(n.output)) == ("Op", ["a", "b"], ["c"])
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    assert attrs["i"] == -3 and attrs["f"] == 0.5 and attrs["s"] == b"x" and attrs["ints"] == [1, -2, 1 << 40]
    np.testing.assert_array_equal(numpy_helper.to_array(attrs["t"]), np.arange(6.0).reshape(2, 3))
    scalar = onnx.NodeProto.FromString(node("Constant", [], ["z"], value=np.asarray(np.int64(7))))
    assert numpy_helper.to_array(scalar.attribute[0].t).shape == ()  # a scalar stays a scalar


def test_a_model_runs_on_onnxruntime():
    graph = model("add", [node("Add", ["x", "y"], ["z"])], {"x": (F32, 2), "y": (F32, 2)}, {"z": (F32, 2)})
    onnx.checker.check_model(onnx.load_from_string(graph), full_check=True)
    session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(session.run(None, {"x": x, "y": x})[0], 2 * x)


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("layers", [1, 3])
def test_every_cache_graph_passes_the_onnx_checker(layers, dtype):
    graphs = [
        cache_graphs.advance(layers, dtype, F32),
        cache_graphs.reorder(layers, dtype),
        cache_graphs.take(layers, dtype, dtype),
        cache_graphs.join(layers, dtype, dtype),
        cache_graphs.grow(layers, dtype, 16),
        cache_graphs.start(layers, 3, dtype, dtype),
    ]
    for graph in graphs:
        onnx.checker.check_model(onnx.load_from_string(graph), full_check=True)
        ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
