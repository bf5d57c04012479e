"""The small ONNX graphs that move a decoding batch's buffers where they live (service/engine/resident.py).

Each is built for one model (its layer count and dtypes) and run on the decoder's provider through
IO binding, so a batch's caches never cross to the host. Names of the tensors are the decoder's
(``contract.decoding.decoder_inputs``): ``past_keys_i``/``past_values_i`` (rows, H, C, Dh),
``cross_keys_i``/``cross_values_i`` (rows, H, S, Dh). A graph that writes a buffer in place names
its output ``<input>_out``; the caller binds both to one OrtValue, and ScatterND, finding its output
where its input is, copies nothing but the updates (onnxruntime's CPU and CUDA kernels alike).
Everything here is data movement but TopK, so a batch decodes bit for bit as the numpy one does.
"""

from __future__ import annotations

import numpy as np

from contract.decoding import per_layer
from service.engine.onnx_proto import Kind, model, node

I64 = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)
VECTOR = (I64, 1)  # indices, pads, sizes
END = np.iinfo(np.int64).max  # a Slice end meaning "to the last column"


def caches(layers: int) -> list[str]:
    return per_layer("past_keys", layers) + per_layer("past_values", layers)


def cross(layers: int) -> list[str]:
    return per_layer("cross_keys", layers) + per_layer("cross_values", layers)


def _const(name: str, value) -> bytes:
    return node("Constant", [], [name], value=np.asarray(value))


def advance(layers: int, cache: np.dtype, scores: np.dtype) -> bytes:
    """After a decoder step: each row's ``k`` best tokens (TopK, ties to the lower id, as the numpy
    search) and the step's keys/values written into cache column ``column``, in place, the cache mask's
    column set with them. Inputs: log_probs (rows, V), k (1,), column (1,), cache_mask (rows, C), the
    step's ``new_keys_i``/``new_values_i`` (rows, H, 1, Dh) and the caches."""
    new = per_layer("new_keys", layers) + per_layer("new_values", layers)
    nodes = [
        node("TopK", ["log_probs", "k"], ["top_values", "top_ids"], axis=-1, largest=1, sorted=1),
        # indices (rows, H, 3) of [row, head, column]: ScatterND writes each (Dh,) vector of the step there
        node("Shape", [new[0]], ["rows_heads"], start=0, end=2),
        node("Shape", [new[0]], ["rows"], start=0, end=1),
        node("Shape", [new[0]], ["heads"], start=1, end=2),
        _const("zero", np.int64(0)),
        _const("one", np.int64(1)),
        _const("last_axis", np.array([1], np.int64)),
        node("Squeeze", ["rows"], ["n_rows"]),
        node("Squeeze", ["heads"], ["n_heads"]),
        node("Range", ["zero", "n_rows", "one"], ["row_ids"]),
        node("Range", ["zero", "n_heads", "one"], ["head_ids"]),
        node("Concat", ["rows_heads", "last_axis"], ["grid"], axis=0),  # [rows, H, 1]
        _const("row_axes", np.array([1, 2], np.int64)),
        _const("head_axes", np.array([0, 2], np.int64)),
        _const("cell", np.array([1, 1, 1], np.int64)),
        node("Unsqueeze", ["row_ids", "row_axes"], ["row_col"]),
        node("Unsqueeze", ["head_ids", "head_axes"], ["head_col"]),
        node("Reshape", ["column", "cell"], ["column_cell"]),
        node("Expand", ["row_col", "grid"], ["row_idx"]),
        node("Expand", ["head_col", "grid"], ["head_idx"]),
        node("Expand", ["column_cell", "grid"], ["column_idx"]),
        node("Concat", ["row_idx", "head_idx", "column_idx"], ["where"], axis=2),
        _const("step_axis", np.array([2], np.int64)),
        # the mask: indices (rows, 2) of [row, column], every one set
        _const("pair", np.array([1, 1], np.int64)),
        node("Unsqueeze", ["row_ids", "last_axis"], ["mask_rows"]),
        node("Reshape", ["column", "pair"], ["mask_column"]),
        node("Concat", ["rows", "last_axis"], ["mask_grid"], axis=0),  # [rows, 1]
        node("Expand", ["mask_column", "mask_grid"], ["mask_columns"]),
        node("Concat", ["mask_rows", "mask_columns"], ["mask_where"], axis=1),
        _const("true", np.array([True])),
        node("Expand", ["true", "rows"], ["trues"]),
        node("ScatterND", ["cache_mask", "mask_where", "trues"], ["cache_mask_out"]),
    ]
    for buf, step in zip(caches(layers), new):
        nodes += [
            node("Squeeze", [step, "step_axis"], [f"{step}_vectors"]),
            node("ScatterND", [buf, "where", f"{step}_vectors"], [f"{buf}_out"]),
        ]
    inputs = {"log_probs": (scores, 2), "k": VECTOR, "column": VECTOR, "cache_mask": (BOOL, 2)}
    inputs |= {n: (cache, 4) for n in new + caches(layers)}
    outputs = {"top_values": (scores, 2), "top_ids": (I64, 2), "cache_mask_out": (BOOL, 2)}
    outputs |= {f"{n}_out": (cache, 4) for n in caches(layers)}
    return model("advance", nodes, inputs, outputs)


def pick(scores: np.dtype) -> bytes:
    """Rows ``rows`` (R,) of a step's ``log_probs`` (rows, V): bound to the host, only those rows cross from the device."""
    nodes = [node("Gather", ["log_probs", "rows"], ["picked"], axis=0)]
    return model("pick", nodes, {"log_probs": (scores, 2), "rows": VECTOR}, {"picked": (scores, 2)})


def reorder(layers: int, cache: np.dtype) -> bytes:
    """Beams reordered in place: cache rows ``moved`` (m, 1) take the rows ``sources`` (m,) held (gathered first)."""
    nodes = []
    for buf in caches(layers):
        nodes += [
            node("Gather", [buf, "sources"], [f"{buf}_moving"], axis=0),
            node("ScatterND", [buf, "moved", f"{buf}_moving"], [f"{buf}_out"]),
        ]
    inputs = {n: (cache, 4) for n in caches(layers)} | {"moved": (I64, 2), "sources": VECTOR}
    return model("reorder", nodes, inputs, {f"{n}_out": (cache, 4) for n in caches(layers)})


def take(layers: int, cache: np.dtype, source: np.dtype) -> bytes:
    """The batch of rows ``rows`` (in that order), cross-attention rows ``cross_rows``: cache columns from
    ``first`` on, source columns before ``last``."""
    nodes = [_const("zero", np.array([0], np.int64)), _const("end", np.array([END], np.int64))]
    nodes.append(_const("column_axis", np.array([2], np.int64)))
    for buf in caches(layers):
        nodes += [
            node("Gather", [buf, "rows"], [f"{buf}_rows"], axis=0),
            node("Slice", [f"{buf}_rows", "first", "end", "column_axis"], [f"{buf}_out"]),
        ]
    for buf in cross(layers):
        nodes += [
            node("Gather", [buf, "cross_rows"], [f"{buf}_rows"], axis=0),
            node("Slice", [f"{buf}_rows", "zero", "last", "column_axis"], [f"{buf}_out"]),
        ]
    inputs = {n: (cache, 4) for n in caches(layers)} | {n: (source, 4) for n in cross(layers)}
    inputs |= {"rows": VECTOR, "cross_rows": VECTOR, "first": VECTOR, "last": VECTOR}
    outputs = {f"{n}_out": (cache, 4) for n in caches(layers)} | {f"{n}_out": (source, 4) for n in cross(layers)}
    return model("take", nodes, inputs, outputs)


def join(layers: int, cache: np.dtype, source: np.dtype) -> bytes:
    """Two batches in one: each one's first ``<side>_width`` cache columns padded by ``<side>_pads`` (8,)
    (so both end at the wider width, with room after), sources padded by ``<side>_source_pads``; rows of
    ``a`` first."""
    nodes = [_const("zero", np.array([0], np.int64)), _const("column_axis", np.array([2], np.int64))]
    for buf in caches(layers):
        for side in ("a", "b"):
            nodes += [
                node("Slice", [f"{side}_{buf}", "zero", f"{side}_width", "column_axis"], [f"{side}_{buf}_used"]),
                node("Pad", [f"{side}_{buf}_used", f"{side}_pads"], [f"{side}_{buf}_padded"]),
            ]
        nodes.append(node("Concat", [f"a_{buf}_padded", f"b_{buf}_padded"], [f"{buf}_out"], axis=0))
    for buf in cross(layers):
        for side in ("a", "b"):
            nodes.append(node("Pad", [f"{side}_{buf}", f"{side}_source_pads"], [f"{side}_{buf}_padded"]))
        nodes.append(node("Concat", [f"a_{buf}_padded", f"b_{buf}_padded"], [f"{buf}_out"], axis=0))
    inputs: dict[str, Kind] = {}
    for side in ("a", "b"):
        inputs |= {f"{side}_{n}": (cache, 4) for n in caches(layers)}
        inputs |= {f"{side}_{n}": (source, 4) for n in cross(layers)}
        inputs |= {f"{side}_width": VECTOR, f"{side}_pads": VECTOR, f"{side}_source_pads": VECTOR}
    outputs = {f"{n}_out": (cache, 4) for n in caches(layers)} | {f"{n}_out": (source, 4) for n in cross(layers)}
    return model("join", nodes, inputs, outputs)


def grow(layers: int, cache: np.dtype, columns: int) -> bytes:
    """Every cache with ``columns`` more columns, zero (a full buffer: each is copied once)."""
    nodes = [_const("pads", np.array([0, 0, 0, 0, 0, 0, columns, 0], np.int64))]
    nodes += [node("Pad", [buf, "pads"], [f"{buf}_out"]) for buf in caches(layers)]
    inputs = {n: (cache, 4) for n in caches(layers)}
    return model("grow", nodes, inputs, {f"{n}_out": (cache, 4) for n in caches(layers)})


def start(layers: int, runs: int, cache: np.dtype, source: np.dtype) -> bytes:
    """A new batch from ``runs`` encoder runs: run r's ``keys_r``/``values_r`` (L, n_r, H, S_r, Dh) padded
    by ``pads_r`` (10,) to the widest source, stacked in run order, their rows picked by ``rows`` (beams
    repeat a request's), split per layer; and empty caches of shape ``cache_shape`` (4,)."""
    nodes = []
    for kind in ("keys", "values"):
        for r in range(runs):
            nodes.append(node("Pad", [f"{kind}_{r}", f"pads_{r}"], [f"{kind}_{r}_padded"]))
        nodes.append(node("Concat", [f"{kind}_{r}_padded" for r in range(runs)], [f"{kind}_all"], axis=1))
        nodes.append(node("Gather", [f"{kind}_all", "rows"], [f"{kind}_rows"], axis=1))
        for i in range(layers):
            nodes += [
                _const(f"layer_{kind}_{i}", np.int64(i)),
                node("Gather", [f"{kind}_rows", f"layer_{kind}_{i}"], [f"cross_{kind}_{i}_out"], axis=0),
            ]
    zero = np.zeros(1, dtype=cache)
    nodes += [node("ConstantOfShape", ["cache_shape"], [f"{buf}_out"], value=zero) for buf in caches(layers)]
    inputs = {f"{kind}_{r}": (source, 5) for kind in ("keys", "values") for r in range(runs)}
    inputs |= {f"pads_{r}": VECTOR for r in range(runs)} | {"rows": VECTOR, "cache_shape": VECTOR}
    outputs = {f"{n}_out": (source, 4) for n in cross(layers)} | {f"{n}_out": (cache, 4) for n in caches(layers)}
    return model("start", nodes, inputs, outputs)
