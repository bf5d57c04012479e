"""``ModelInferRequest`` in, ``ModelInferResponse`` out: the protocol's gRPC messages as ``service/oip/tensors.py``'s.

An input's elements come either in ``raw_input_contents`` (one entry per input, in order, for all
inputs or none: little-endian numbers, a ``BYTES`` element as a 4-byte length and its bytes; what
``tritonclient.grpc`` sends) or in the input's typed ``contents`` (``fp32_contents``,
``bytes_contents``, ...). Either way they are bytes, never base64 text: an image is its file.
Outputs always go back in ``raw_output_contents``, as Triton answers.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import Message

from service.errors import InvalidField
from service.grpc.generated import grpc_service_pb2 as pb
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

# The typed field of InferTensorContents that carries each datatype.
CONTENTS = {
    "BOOL": "bool_contents",
    **dict.fromkeys(("INT8", "INT16", "INT32"), "int_contents"),
    "INT64": "int64_contents",
    **dict.fromkeys(("UINT8", "UINT16", "UINT32"), "uint_contents"),
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameters(params: Any) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` as plain values (bool, int, str or float)."""
    out = {}
    for key, param in params.items():
        choice = param.WhichOneof("parameter_choice")
        if choice is not None:
            out[key] = getattr(param, choice)
    return out


def read_request(request: pb.ModelInferRequest) -> InferRequest:
    """Check and convert an inference request: every input's data matches its shape and datatype."""
    if not request.inputs:
        raise InvalidField("an inference request has at least one input")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidField(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs: one per input")
    inputs: dict[str, Tensor] = {}
    for i, spec in enumerate(request.inputs):
        tensor = _read_input(spec, i, raw[i] if raw else None)
        if tensor.name in inputs:
            raise InvalidField(f"input {tensor.name!r} is given twice")
        inputs[tensor.name] = tensor
    outputs = {out.name: parameters(out.parameters) for out in request.outputs}
    return InferRequest(request.id or None, inputs, parameters(request.parameters), outputs)


def _read_input(spec: pb.ModelInferRequest.InferInputTensor, index: int, raw: bytes | None) -> Tensor:
    name, datatype, shape = spec.name, spec.datatype, list(spec.shape)
    if not name:
        raise InvalidField(f"inputs[{index}] has no `name`")
    if datatype != "BYTES" and datatype not in NUMERIC:
        raise InvalidField(f"input {name!r}: unknown datatype {datatype!r}")
    if any(d < 0 for d in shape):
        raise InvalidField(f"input {name!r}: `shape` must be non-negative integers")
    count = math.prod(shape)  # exact: numpy's int64 product wraps past 2**63
    if raw is not None:
        data = bytes_from_raw(raw, name) if datatype == "BYTES" else numeric_from_raw(raw, datatype, name)
    else:
        field = CONTENTS.get(datatype)
        if field is None:
            raise InvalidField(f"input {name!r}: {datatype} data comes in raw_input_contents only")
        values = getattr(spec.contents, field)
        data = object_array(list(values)) if datatype == "BYTES" else np.asarray(values, dtype=NUMERIC[datatype])
    if data.size != count:
        raise InvalidField(f"input {name!r}: shape {shape} needs {count} elements, the data has {data.size}")
    return Tensor(name, datatype, shape, data.reshape(shape), parameters(spec.parameters), raw=True)


def write_response(request: InferRequest, model: str, version: str, outputs: list[Output]) -> pb.ModelInferResponse:
    """``(name, datatype, array)`` outputs as the protocol's answer, their data in ``raw_output_contents``."""
    response = pb.ModelInferResponse(model_name=model, model_version=version, id=request.id or "")
    for name, datatype, array in outputs:
        response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        response.raw_output_contents.append(to_raw(array, datatype))
    return response


def from_json(doc: dict, message: Message) -> Message:
    """``doc`` (the protocol's JSON form of ``message``'s type) parsed into ``message``."""
    return json_format.ParseDict(doc, message)
