"""The per-row int8 rewrite (export/int8_rows.py): what it computes, and that a row's answer is its own."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from contract.decoding import DecoderSpec
from contract.manifest import load_entry
from export.int8_rows import quantize_weight, rewrite
from tests.conftest import SHIPPED_TRANSLATOR

K, N, V = 16, 8, 12


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The rewrite's product in numpy: x per row, w per column, both to int8, the integers multiplied."""
    s = np.maximum(np.abs(x).max(axis=-1, keepdims=True) / 127, 1e-30)
    q = np.round(x / s)  # numpy rounds half to even, as QuantizeLinear does
    wq, ws = quantize_weight(w)
    return (q.astype(np.int64) @ wq.astype(np.int64)).astype(np.float32) * ws * s


@pytest.fixture(scope="module")
def small():
    """ids -> embedding (Gather) -> MatMul by W, Gemm by Vt (transB), MatMul by a Transpose of W2."""
    rng = np.random.default_rng(0)
    table, w, vt, w2 = (rng.standard_normal(shape).astype(np.float32) for shape in ((V, K), (K, N), (N, K), (N, K)))
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["x"], axis=0),
        helper.make_node("MatMul", ["x", "w"], ["a"]),
        helper.make_node("Gemm", ["x2", "vt"], ["b"], transB=1),
        helper.make_node("Transpose", ["w2"], ["w2t"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "w2t"], ["c"]),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["rows"]),
            helper.make_tensor_value_info("x2", 1, ["rows", K]),
        ],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["rows", N]) for y in "abc"]
        + [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", K])],
        [numpy_helper.from_array(a, n) for a, n in ((table, "table"), (w, "w"), (vt, "vt"), (w2, "w2"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    quantised = onnx.ModelProto()
    quantised.CopyFrom(model)
    count = rewrite(quantised)
    onnx.checker.check_model(quantised)
    return model, quantised, count, (table, w, vt, w2)


def test_every_constant_product_is_rewritten_and_no_float_matrix_is_left(small):
    _, q, count, _ = small
    assert count == 3
    ops = [n.op_type for n in q.graph.node]
    assert "Transpose" not in ops and "Gemm" not in ops and ops.count("MatMulIntegerToFloat") == 3
    floats = [i.name for i in q.graph.initializer if i.data_type == TensorProto.FLOAT and len(i.dims) == 2]
    assert floats == ["table.int8_row_scale"]  # (V, 1): the tables and weights are all int8


def test_the_products_and_the_lookup_are_the_per_row_scheme(small):
    _, q, _, (table, w, vt, w2) = small
    rng = np.random.default_rng(1)
    ids = np.array([3, 0, 11, 3])
    x2 = (rng.standard_normal((4, K)) * [[1], [100], [0.01], [0]]).astype(np.float32)
    a, b, c, x = session(q).run(None, {"ids": ids, "x2": x2})
    tq, ts = quantize_weight(table.T)
    np.testing.assert_allclose(x, (tq.T[ids] * ts[ids, None]), rtol=1e-6)
    np.testing.assert_allclose(a, reference(x, w), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, reference(x2, vt.T), rtol=1e-5, atol=1e-6)  # the row of zeros gives zeros
    np.testing.assert_allclose(c, reference(x, w2.T), rtol=1e-5, atol=1e-6)
    assert np.abs(x - table[ids]).max() <= np.abs(table).max() / 127  # within half a step of the row's scale


def test_a_row_gets_the_same_bits_alone_as_in_any_batch(small):
    _, q, _, _ = small
    s, rng = session(q), np.random.default_rng(2)
    ids, x2 = (
        rng.integers(0, V, 32),
        (rng.standard_normal((32, K)) * rng.uniform(0.01, 100, (32, 1))).astype(np.float32),
    )
    batched = s.run(None, {"ids": ids, "x2": x2})
    for i in (0, 7, 31):
        alone = s.run(None, {"ids": ids[i : i + 1], "x2": x2[i : i + 1]})
        for got, full in zip(alone, batched):
            assert np.array_equal(got[0], full[i])


def test_the_shipped_decoder_rewritten_answers_each_row_alone_as_in_a_batch(tmp_path):
    from benchmarks.bench_decoder_step import feeds

    m = onnx.load(str(SHIPPED_TRANSLATOR / "decoder.onnx"))
    assert rewrite(m) > 0
    s = session(m)
    spec = DecoderSpec.from_manifest(load_entry(SHIPPED_TRANSLATOR).manifest)
    x = feeds(spec, 16, np.random.default_rng(3))
    batched = s.run(["log_probs"], x)[0]
    for i in (0, 5, 15):
        alone = s.run(["log_probs"], {k: v[i : i + 1] for k, v in x.items()})[0]
        assert np.array_equal(alone[0], batched[i])
