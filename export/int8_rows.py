"""int8 products quantised row by row, as CTranslate2 quantises them: a graph rewrite.

Every ``MatMul`` (and ``Gemm`` with a transposed weight, or ``MatMul`` by a ``Transpose`` of one: a tied
output projection) whose weight is a constant 2-D matrix becomes an integer product: the weight quantised once to int8 with a scale per
output column, the activations at run time with a scale **per row** (each row's largest magnitude
maps to 127). A row's answer depends on that row alone, so a sentence decodes to the same tokens
alone or in any batch, which onnxruntime's dynamic quantisation (one scale for the whole activation
tensor) does not give. The activations go to the integer product as uint8 with a zero point of 128
(onnxruntime's fast u8 x s8 kernels; int8 x int8 takes a slower path there). An embedding table (a
``Gather`` from a constant matrix) is stored in int8 with a scale per row, each token's vector scaled
on its own.

For an activation ``x`` (…, K) and a weight ``W`` (K, N) the rewrite computes
``s = max(|x|, axis=-1) / 127``, ``q = round(x / s) + 128`` (uint8, saturating),
``y = MatMulIntegerToFloat(q, Wq, 1, Ws, 128) * s`` (onnxruntime's contrib op: the integer product
with the column scales applied in its kernel). An activation several products read (a layer's
query, key and value projections) is quantised once. Weights keep their names with ``.int8`` and
``.int8_scale`` added, so graphs that shared a parameter share its quantised form
(:mod:`export.shared_weights`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

METHOD = "int8 products, activations quantised per row and weights per output column (CTranslate2's scheme)"
ZERO = 128  # the activations' zero point as uint8
EPS = 1e-30  # a row of zeros gets this scale instead of 0 (its product is 0 either way)


def _weight(
    node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], transposed: dict[str, str]
) -> tuple[str, np.ndarray] | None:
    """(name for the quantised form, the (K, N) weight) when ``node`` is a product by a constant matrix
    (``transposed``: outputs of a ``Transpose`` of one, to the matrix's name)."""
    if node.op_type == "MatMul" and len(node.input) == 2 and node.input[1] in transposed:
        name = transposed[node.input[1]]
        return f"{name}.T", numpy_helper.to_array(inits[name]).T
    if len(node.input) < 2 or node.input[1] not in inits or len(inits[node.input[1]].dims) != 2:
        return None
    name = node.input[1]
    if node.op_type == "MatMul":
        return name, numpy_helper.to_array(inits[name])
    if node.op_type == "Gemm" and len(node.input) == 2:  # a bias would need its own rewrite
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("transB") == 1 and not attrs.get("transA") and attrs.get("alpha", 1.0) == 1.0:
            return f"{name}.T", numpy_helper.to_array(inits[name]).T
    return None


def _table(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    """Whether ``node`` looks rows up in a constant float matrix (an embedding)."""
    if node.op_type != "Gather" or node.input[0] not in inits:
        return False
    t = inits[node.input[0]]
    axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 0)
    return len(t.dims) == 2 and axis == 0 and t.data_type == TensorProto.FLOAT


def _gather_rows(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], added: dict) -> list[onnx.NodeProto]:
    """An embedding lookup from the table quantised per row (a token's vector with its own scale)."""
    name, ids, y = node.input[0], node.input[1], node.output[0]
    if f"{name}.int8_rows" not in added:
        wq, ws = quantize_weight(numpy_helper.to_array(inits[name]).T)  # a scale per column of the transpose
        added[f"{name}.int8_rows"] = numpy_helper.from_array(np.ascontiguousarray(wq.T), f"{name}.int8_rows")
        added[f"{name}.int8_row_scale"] = numpy_helper.from_array(ws[:, None], f"{name}.int8_row_scale")
    p = f"int8_rows.{y}"
    return [
        helper.make_node("Gather", [f"{name}.int8_rows", ids], [f"{p}.q"], name=f"{p}.q", axis=0),
        helper.make_node("Gather", [f"{name}.int8_row_scale", ids], [f"{p}.s"], name=f"{p}.s", axis=0),
        helper.make_node("Cast", [f"{p}.q"], [f"{p}.f"], to=TensorProto.FLOAT, name=f"{p}.f"),
        helper.make_node("Mul", [f"{p}.f", f"{p}.s"], [y], name=f"{p}.mul"),
    ]


def quantize_weight(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weight, float32 scale per output column) of a (K, N) matrix."""
    scale = (np.maximum(np.abs(w).max(axis=0), EPS) / 127).astype(np.float32)
    return np.clip(np.round(w / scale), -127, 127).astype(np.int8), scale


def rewrite(model: onnx.ModelProto) -> int:
    """Quantise ``model``'s constant products in place; returns how many."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    constants = [
        numpy_helper.from_array(np.array([-1], np.int64), "int8_rows.axes"),
        numpy_helper.from_array(np.array(1 / 127, np.float32), "int8_rows.inv127"),
        numpy_helper.from_array(np.array(EPS, np.float32), "int8_rows.eps"),
        numpy_helper.from_array(np.array(1.0, np.float32), "int8_rows.one"),
        numpy_helper.from_array(np.array(ZERO, np.uint8), "int8_rows.zero"),
    ]
    transposes = {
        n.output[0]: n
        for n in g.node
        if n.op_type == "Transpose"
        and n.input[0] in inits
        and len(inits[n.input[0]].dims) == 2
        and [list(helper.get_attribute_value(a)) for a in n.attribute if a.name == "perm"] in ([], [[1, 0]])
    }
    transposed = {out: n.input[0] for out, n in transposes.items()}
    nodes: list[onnx.NodeProto] = []
    added: dict[str, onnx.TensorProto] = {}
    rows: dict[str, tuple[str, str]] = {}  # activation -> (its uint8 form, its per-row scale)
    count = 0
    for node in g.node:
        if _table(node, inits):
            nodes += _gather_rows(node, inits, added)
            continue
        if node.output[0] in transposes:  # put back below if anything but a quantised product reads it
            continue
        found = _weight(node, inits, transposed)
        if found is None:
            nodes.append(node)
            continue
        name, w = found
        if f"{name}.int8" not in added:
            wq, ws = quantize_weight(w)
            added[f"{name}.int8"] = numpy_helper.from_array(wq, f"{name}.int8")
            added[f"{name}.int8_scale"] = numpy_helper.from_array(ws, f"{name}.int8_scale")
        x, y, p = node.input[0], node.output[0], f"int8_rows.{count}"
        if x not in rows:
            q = f"int8_rows.x{len(rows)}"
            nodes += [
                helper.make_node("Abs", [x], [f"{q}.abs"], name=f"{q}.abs"),
                helper.make_node(
                    "ReduceMax", [f"{q}.abs", "int8_rows.axes"], [f"{q}.max"], keepdims=1, name=f"{q}.max"
                ),
                helper.make_node("Mul", [f"{q}.max", "int8_rows.inv127"], [f"{q}.s0"], name=f"{q}.s0"),
                helper.make_node("Max", [f"{q}.s0", "int8_rows.eps"], [f"{q}.s"], name=f"{q}.s"),
                helper.make_node("Div", [x, f"{q}.s"], [f"{q}.scaled"], name=f"{q}.scaled"),
                helper.make_node(
                    "QuantizeLinear", [f"{q}.scaled", "int8_rows.one", "int8_rows.zero"], [f"{q}.u8"], name=f"{q}.u8"
                ),
            ]
            rows[x] = (f"{q}.u8", f"{q}.s")
        xq, s = rows[x]
        nodes += [
            helper.make_node(
                "MatMulIntegerToFloat",
                [xq, f"{name}.int8", "int8_rows.one", f"{name}.int8_scale", "int8_rows.zero"],
                [f"{p}.cols"],
                name=f"{p}.mm",
                domain="com.microsoft",
            ),
            helper.make_node("Mul", [f"{p}.cols", s], [y], name=f"{p}.rows"),
        ]
        count += 1
    used = {i for n in nodes for i in n.input}
    nodes = [n for out, n in transposes.items() if out in used] + nodes
    used = {i for n in nodes for i in n.input}
    kept = [i for i in g.initializer if i.name in used]
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    g.initializer.extend(kept + [t for t in [*constants, *added.values()] if t.name in used])
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return count


def quantize_graph(src: Path, dst: Path) -> int:
    """Write ``src`` (an ONNX graph, its external data beside it) to ``dst`` with its products in int8,
    every tensor inside the file (:func:`export.shared_weights.share_weights` moves them out)."""
    model = onnx.load(str(src))
    count = rewrite(model)
    onnx.save(model, str(dst))
    return count
