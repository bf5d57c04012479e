"""The checked-in protocol files and their generated modules cannot drift: from each other (regenerated
and compared), nor from the protocol ``tritonclient.grpc`` speaks (the same descriptors, byte for byte)."""

from __future__ import annotations

import pytest

from service.grpc import generate


def test_the_generated_modules_are_what_the_protos_compile_to(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the test extra) compiles the protocol files")
    fresh = {p.name: p.read_text() for p in generate.generate(tmp_path)}
    fresh["__init__.py"] = (tmp_path / "__init__.py").read_text()
    checked_in = {p.name: p.read_text() for p in generate.GENERATED.glob("*.py")}
    assert checked_in == fresh, "run `python -m service.grpc.generate` and commit what it writes"


def test_the_protos_are_tritonclients():
    from tritonclient.grpc import model_config_pb2 as triton_config
    from tritonclient.grpc import service_pb2 as triton_service

    from service.grpc.generated import grpc_service_pb2, model_config_pb2

    assert grpc_service_pb2.DESCRIPTOR.serialized_pb == triton_service.DESCRIPTOR.serialized_pb
    assert model_config_pb2.DESCRIPTOR.serialized_pb == triton_config.DESCRIPTOR.serialized_pb
