"""Reading an inference request's tensors, on both transports: the element count of a shape is exact."""

from __future__ import annotations

import json

import numpy as np
import pytest

from service.errors import InvalidField
from service.grpc import tensors as grpc_tensors
from service.grpc.generated import grpc_service_pb2 as pb
from service.http import oip as rest_tensors

# 2**32 x 2**32 elements: numpy's int64 product of this shape wraps to 0, which empty data would match.
HUGE = [2**32, 2**32]


def grpc_request(shape: list[int], data: bytes) -> pb.ModelInferRequest:
    tensor = pb.ModelInferRequest.InferInputTensor(name="pixels", datatype="FP32", shape=shape)
    return pb.ModelInferRequest(model_name="vit", inputs=[tensor], raw_input_contents=[data])


def rest_body(shape: list[int], data: bytes) -> tuple[bytes, str]:
    spec = {"name": "pixels", "datatype": "FP32", "shape": shape, "parameters": {"binary_data_size": len(data)}}
    header = json.dumps({"inputs": [spec]}).encode()
    return header + data, str(len(header))


@pytest.mark.parametrize("read", ["grpc", "rest"])
def test_a_shape_past_int64_elements_is_refused_not_wrapped(read):
    with pytest.raises(InvalidField, match="needs 18446744073709551616 elements"):
        if read == "grpc":
            grpc_tensors.read_request(grpc_request(HUGE, b""))
        else:
            rest_tensors.read_request(*rest_body(HUGE, b""))


@pytest.mark.parametrize("read", ["grpc", "rest"])
def test_raw_fp32_is_read_as_sent(read):
    pixels = np.arange(6, dtype="<f4").reshape(1, 2, 3)
    if read == "grpc":
        req = grpc_tensors.read_request(grpc_request([1, 2, 3], pixels.tobytes()))
    else:
        req = rest_tensors.read_request(*rest_body([1, 2, 3], pixels.tobytes()))
    np.testing.assert_array_equal(req.inputs["pixels"].data, pixels)
