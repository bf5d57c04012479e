"""The few ONNX messages a small graph needs, written straight in protobuf's wire format.

The service builds its cache graphs (``service/engine/cache_graphs.py``) at load time, for the
model's layer count and dtypes, and must not import the ``onnx`` package (a training/export
dependency; tests/test_imports.py). A model is a handful of nested messages, so it is written here
field by field, with the field numbers of onnx.proto; tests/service/engine/test_onnx_proto.py reads
what this writes back with ``onnx`` and checks it with the ONNX checker.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

OPSET = 18
IR_VERSION = 8
ELEMENT_TYPES = {  # TensorProto.DataType of each numpy dtype the graphs use
    np.dtype(np.float32): 1,
    np.dtype(np.int64): 7,
    np.dtype(np.bool_): 9,
    np.dtype(np.float16): 10,
    np.dtype(np.float64): 11,
}
_VARINT, _FIXED32, _BYTES = 0, 5, 2
_FLOAT, _INT, _STRING, _TENSOR, _INTS = 1, 2, 3, 4, 7  # AttributeProto.AttributeType


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64s are ten bytes of two's complement
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _int(field: int, n: int) -> bytes:
    return _key(field, _VARINT) + _varint(n)


def _bytes(field: int, data: bytes | str) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return _key(field, _BYTES) + _varint(len(raw)) + raw


def tensor(array: np.ndarray, name: str = "") -> bytes:
    """TensorProto: dims 1, data_type 2, name 8, raw_data 9 (little-endian)."""
    a = np.asarray(array)  # (np.ascontiguousarray would make a scalar 1-d)
    body = b"".join(_int(1, d) for d in a.shape) + _int(2, ELEMENT_TYPES[a.dtype])
    return body + (_bytes(8, name) if name else b"") + _bytes(9, a.astype(a.dtype.newbyteorder("<")).tobytes(order="C"))


def _attribute(name: str, value) -> bytes:
    """AttributeProto: name 1, f 2, i 3, s 4, t 5, ints 8, type 20."""
    head = _bytes(1, name)
    if isinstance(value, bool | int):
        return head + _int(3, int(value)) + _int(20, _INT)
    if isinstance(value, float):
        return head + _key(2, _FIXED32) + struct.pack("<f", value) + _int(20, _FLOAT)
    if isinstance(value, str):
        return head + _bytes(4, value) + _int(20, _STRING)
    if isinstance(value, np.ndarray):
        return head + _bytes(5, tensor(value)) + _int(20, _TENSOR)
    return head + b"".join(_int(8, v) for v in value) + _int(20, _INTS)


def node(op: str, inputs: Sequence[str], outputs: Sequence[str], **attributes) -> bytes:
    """NodeProto: input 1, output 2, op_type 4, attribute 5."""
    body = b"".join(_bytes(1, i) for i in inputs) + b"".join(_bytes(2, o) for o in outputs) + _bytes(4, op)
    return body + b"".join(_bytes(5, _attribute(k, v)) for k, v in attributes.items())


def _value_info(name: str, kind: tuple[np.dtype, int]) -> bytes:
    """ValueInfoProto (name 1, type 2) of a tensor of a dtype and a rank, every dimension unnamed:
    TypeProto.tensor_type 1 -> (elem_type 1, shape 2 -> one empty dim 1 per axis)."""
    dtype, rank = kind
    shape = _bytes(2, b"".join(_bytes(1, b"") for _ in range(rank)))
    return _bytes(1, name) + _bytes(2, _bytes(1, _int(1, ELEMENT_TYPES[np.dtype(dtype)]) + shape))


Kind = tuple[np.dtype, int]  # a graph input's or output's dtype and rank


def model(name: str, nodes: Sequence[bytes], inputs: dict[str, Kind], outputs: dict[str, Kind]) -> bytes:
    """ModelProto (ir_version 1, graph 7, opset_import 8) of a graph (node 1, name 2, input 11, output 12)."""
    graph = b"".join(_bytes(1, n) for n in nodes) + _bytes(2, name)
    graph += b"".join(_bytes(11, _value_info(k, t)) for k, t in inputs.items())
    graph += b"".join(_bytes(12, _value_info(k, t)) for k, t in outputs.items())
    opset = _bytes(1, "") + _int(2, OPSET)
    return _int(1, IR_VERSION) + _bytes(2, "attnserve") + _bytes(7, graph) + _bytes(8, opset)
