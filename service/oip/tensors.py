"""The protocol's tensors and inference request, as both transports hand them to ``service/oip/operations.py``.

A tensor's data is a numpy array of its shape: of the datatype's little-endian dtype (``NUMERIC``),
or for ``BYTES`` an object array of ``bytes``. ``raw`` says the elements came as raw bytes (REST's
binary tensor data extension, gRPC's ``raw_input_contents`` or ``bytes_contents``) rather than as
JSON text, which matters for an image: raw, it is the file; in JSON, base64 text.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.errors import InvalidField

NUMERIC = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}

Output = tuple[str, str, np.ndarray]  # (name, datatype, array) of one output tensor


@dataclass
class Tensor:
    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray  # numeric: of the datatype; BYTES: an object array of ``bytes``
    parameters: dict[str, Any] = field(default_factory=dict)
    raw: bool = False  # the elements came as bytes, not as JSON text


@dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, Tensor]
    parameters: dict[str, Any]
    outputs: dict[str, dict[str, Any]]  # requested output name -> its parameters (empty: all outputs)

    def wants_binary(self, output: str) -> bool:
        params = self.outputs.get(output, {})
        return bool(params.get("binary_data", self.parameters.get("binary_data_output", False)))


def object_array(items: list) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def numeric_from_raw(raw: bytes, datatype: str, name: str) -> np.ndarray:
    dtype = NUMERIC[datatype]
    if len(raw) % dtype.itemsize:
        raise InvalidField(f"input {name!r}: {len(raw)} bytes is not a whole number of {datatype} elements")
    return np.frombuffer(raw, dtype)


def bytes_from_raw(raw: bytes, name: str) -> np.ndarray:
    out, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise InvalidField(f"input {name!r}: a BYTES element's 4-byte length is cut off")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise InvalidField(f"input {name!r}: a BYTES element of {length} bytes runs past the data")
        out.append(raw[offset : offset + length])
        offset += length
    return object_array(out)


def to_raw(array: np.ndarray, datatype: str) -> bytes:
    """``array`` as raw tensor data: little-endian numbers, or each BYTES element as a 4-byte length and its bytes."""
    if datatype != "BYTES":
        return np.ascontiguousarray(array, NUMERIC[datatype]).tobytes()
    parts = []
    for v in array.ravel():
        b = v if isinstance(v, bytes) else str(v).encode()
        parts += [struct.pack("<I", len(b)), b]
    return b"".join(parts)
