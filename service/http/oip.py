"""Tensors of the Open Inference Protocol (KServe v2 REST), in JSON and with the binary data extension.

An inference request is a JSON object (``inputs``: name, shape, datatype, data or parameters), or,
with the binary tensor data extension, a JSON header of ``Inference-Header-Content-Length`` bytes
followed by the inputs' raw data in the order they are listed (each with its ``binary_data_size``).
Raw data is little-endian and row-major; a ``BYTES`` element is a 4-byte length and its bytes.
Errors under ``/v2`` are the protocol's body, ``{"error": "..."}`` (``service.http.errors.error_format``).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from starlette.responses import Response

from service.errors import InvalidField, InvalidJSON
from service.oip.tensors import (
    NUMERIC,
    InferRequest,
    Output,
    Tensor,
    bytes_from_raw,
    numeric_from_raw,
    object_array,
    to_raw,
)

HEADER_LENGTH = "inference-header-content-length"
__all__ = ["NUMERIC", "InferRequest", "Tensor", "json_object", "read_request", "write_response"]


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidJSON(f"the body is not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise InvalidField("the body must be a JSON object")
    return doc


def read_request(body: bytes, header_length: str | None) -> InferRequest:
    """Parse and check an inference request: every input's data matches its shape and datatype."""
    if header_length is not None:
        try:
            split = int(header_length)
        except ValueError:
            raise InvalidField("Inference-Header-Content-Length is not a number") from None
        if not 0 < split <= len(body):
            raise InvalidField(f"Inference-Header-Content-Length {split} does not fit a body of {len(body)} bytes")
        header, binary = body[:split], memoryview(body)[split:]
    else:
        header, binary = body, memoryview(b"")
    try:
        doc = json.loads(header)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidJSON(f"the inference request is not valid JSON: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list) or not doc["inputs"]:
        raise InvalidField("an inference request is a JSON object with a non-empty `inputs` list")
    inputs: dict[str, Tensor] = {}
    offset = 0
    for i, spec in enumerate(doc["inputs"]):
        tensor, used = _read_input(spec, i, binary[offset:])
        if tensor.name in inputs:
            raise InvalidField(f"input {tensor.name!r} is given twice")
        inputs[tensor.name] = tensor
        offset += used
    if offset != len(binary):
        raise InvalidField(f"{len(binary) - offset} bytes of binary data follow the inputs that declare theirs")
    outputs = {}
    requested = doc.get("outputs")
    if not isinstance(requested, (list, type(None))):
        raise InvalidField("`outputs` must be a list")
    for spec in requested or []:
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise InvalidField("each requested output is an object with a `name`")
        outputs[spec["name"]] = _parameters(spec, f"output {spec['name']!r}")
    request_id = doc.get("id")
    return InferRequest(
        None if request_id is None else str(request_id), inputs, _parameters(doc, "the request"), outputs
    )


def _parameters(spec: dict, where: str) -> dict[str, Any]:
    params = spec.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidField(f"{where}: `parameters` must be an object")
    return params


def _read_input(spec: Any, index: int, binary: memoryview) -> tuple[Tensor, int]:
    if not isinstance(spec, dict):
        raise InvalidField(f"inputs[{index}] must be an object")
    name, datatype, shape = spec.get("name"), spec.get("datatype"), spec.get("shape")
    if not isinstance(name, str) or not name:
        raise InvalidField(f"inputs[{index}] has no `name`")
    if datatype != "BYTES" and datatype not in NUMERIC:
        raise InvalidField(f"input {name!r}: unknown datatype {datatype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InvalidField(f"input {name!r}: `shape` must be a list of non-negative integers")
    count = math.prod(shape)  # exact: numpy's int64 product wraps past 2**63
    params = _parameters(spec, f"input {name!r}")
    size = params.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or size < 0 or size > len(binary):
            raise InvalidField(f"input {name!r}: binary_data_size {size!r} exceeds the binary data left")
        raw = bytes(binary[:size])
        data = bytes_from_raw(raw, name) if datatype == "BYTES" else numeric_from_raw(raw, datatype, name)
        used = size
    else:
        if "data" not in spec:
            raise InvalidField(f"input {name!r} has neither `data` nor a `binary_data_size`")
        data = _json_elements(spec["data"], datatype, name)
        used = 0
    if data.size != count:
        raise InvalidField(f"input {name!r}: shape {shape} needs {count} elements, the data has {data.size}")
    return Tensor(name, datatype, shape, data.reshape(shape), params, raw=size is not None), used


def _json_elements(data: Any, datatype: str, name: str) -> np.ndarray:
    flat = _flatten(data)
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise InvalidField(f"input {name!r}: BYTES data in JSON must be strings")
        return object_array([v.encode() for v in flat])
    if not all(isinstance(v, (int, float)) and (datatype == "BOOL") == isinstance(v, bool) for v in flat):
        raise InvalidField(f"input {name!r}: {datatype} data must be {'booleans' if datatype == 'BOOL' else 'numbers'}")
    try:
        return np.asarray(flat, dtype=NUMERIC[datatype])
    except OverflowError as e:
        raise InvalidField(f"input {name!r}: a value does not fit {datatype}") from e


def _flatten(data: Any) -> list:
    if not isinstance(data, list):
        return [data]
    out: list = []
    for item in data:
        out += _flatten(item)
    return out


def write_response(request: InferRequest, model: str, version: str, outputs: list[Output]) -> Response:
    """``(name, datatype, array)`` outputs as the protocol's answer, each as JSON or binary as asked."""
    described, chunks = [], []
    for name, datatype, array in outputs:
        out: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if request.wants_binary(name):
            raw = to_raw(array, datatype)
            out["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif datatype == "BYTES":
            out["data"] = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.ravel()]
        else:
            out["data"] = array.ravel().tolist()
        described.append(out)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": described}
    if request.id is not None:
        doc["id"] = request.id
    header = json.dumps(doc, ensure_ascii=False).encode()
    if not chunks:
        return Response(header, media_type="application/json")
    return Response(
        b"".join([header, *chunks]),
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
