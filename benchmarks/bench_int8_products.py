"""One int8 product of the translator's shapes, three ways, interleaved: time per rows, and whether a row's
answer depends on the rows beside it.

``python -m benchmarks.bench_int8_products [--rounds 7]``

For each product the decoder step runs (K x N: 256 x 256 attention projections, 256 x 1024 and 1024 x 256
feed-forward, 256 x 8000 output projection), on random weights and activations, one intra-op thread:

- ``rows``: what the shipped int8 variant runs (:mod:`export.int8_rows`: activations quantised per row in
  graph nodes, ``MatMulIntegerToFloat``, a scale per row multiplied back);
- ``nbits``: onnxruntime's fused 8-bit product (``MatMulNBits``, ``accuracy_level=4``: the kernel quantises
  activations per block itself), blocks of 128 along K, asymmetric, as ``matmul_nbits_quantizer`` makes it;
- ``nbits-row``: the same with one block per row (block = K, at most 256) and symmetric weights: the
  rows' own scheme, where the kernel allows it.

Per rows (1 to 64) it prints each one's median time per product and, per kernel, whether row 0's answer
is the same bits computed alone and inside the batch (``batch-invariant``; if not, the largest
difference). It answers whether a kernel could serve some batch sizes and the rows graph others without a
sentence's translation depending on the traffic beside it.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from export.int8_rows import rewrite

SHAPES = ((256, 256), (256, 1024), (1024, 256), (256, 8000))
ROWS = (1, 2, 4, 8, 16, 32, 64)
REPEAT = 40  # products timed back to back per measurement


def matmul(weight: np.ndarray) -> onnx.ModelProto:
    k, n = weight.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "product",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", n])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def variants(weight: np.ndarray) -> dict[str, onnx.ModelProto]:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    rows = matmul(weight)
    rewrite(rows)
    out = {"rows": rows}
    for name, block, symmetric in (("nbits", 128, False), ("nbits-row", min(weight.shape[0], 256), True)):
        q = MatMulNBitsQuantizer(matmul(weight), bits=8, block_size=block, is_symmetric=symmetric, accuracy_level=4)
        q.process()
        out[name] = q.model.model
    return out


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def invariance(s: ort.InferenceSession, x: np.ndarray) -> float:
    """The largest difference between row 0 computed alone and inside each batch of ``ROWS``."""
    alone = s.run(None, {"x": x[:1]})[0]
    return max(float(np.abs(s.run(None, {"x": x[:n]})[0][:1] - alone).max()) for n in ROWS)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_int8_products", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    p.add_argument("--shapes", nargs="+", default=[f"{k}x{n}" for k, n in SHAPES], help="KxN products")
    args = p.parse_args(argv)
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    logging.disable(logging.INFO)
    rng = np.random.default_rng(0)
    print(f"onnxruntime {ort.__version__}, one intra-op thread, medians of {args.rounds} rounds of {REPEAT} products")
    for shape in args.shapes:
        k, n = (int(v) for v in shape.split("x"))
        weight = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
        sessions = {name: session(model) for name, model in variants(weight).items()}
        x = rng.standard_normal((max(args.rows), k)).astype(np.float32)
        for name, s in sessions.items():
            diff = invariance(s, x)
            verdict = "batch-invariant" if diff == 0 else f"NOT batch-invariant (row alone vs in a batch: {diff:.1e})"
            print(f"{k} x {n} {name}: {verdict}")
        for rows in args.rows:
            feed = {"x": x[:rows]}
            times: dict[str, list[float]] = {name: [] for name in sessions}
            for _ in range(args.rounds):
                for name, s in sessions.items():
                    start = time.perf_counter()
                    for _ in range(REPEAT):
                        s.run(None, feed)
                    times[name].append((time.perf_counter() - start) / REPEAT * 1000)
            base = statistics.median(times["rows"])
            cells = [f"rows {base:.4f} ms"] + [
                f"{name} {statistics.median(t):.4f} ms ({base / statistics.median(t):.2f}x)"
                for name, t in times.items()
                if name != "rows"
            ]
            print(f"{k} x {n}, {rows:2d} rows: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
