"""Servers for the service tests: ``python -m service`` in a subprocess, or uvicorn in a thread.

Both listen on a free loopback port and serve the tiny ViT of the session's model repository
through real onnxruntime sessions. The thread variant exists for tests that must hold the model
at a known point (warm-up, a running batch): they wrap the real method with a gate, nothing is
replaced.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.service.service_testing import (
    BASE_ENV,
    RedisServer,
    SubprocessServer,
    ThreadServer,
    png_bytes,
    start_subprocess_server,
)


@pytest.fixture(scope="session")
def fashion_test() -> tuple[np.ndarray, np.ndarray]:
    """The first 64 real Fashion-MNIST test images (uint8, (N, 28, 28, 1)) and their labels."""
    from model.data import load_image_dataset

    data = load_image_dataset("fashion-mnist")
    return data.test_images[:64], data.test_labels[:64]


@pytest.fixture(scope="session")
def fashion_pngs(fashion_test) -> list[bytes]:
    images, _ = fashion_test
    return [png_bytes(img[..., 0]) for img in images]


@pytest.fixture(scope="module")
def server(tiny_vit_repository, tmp_path_factory) -> Iterator[SubprocessServer]:
    """``python -m service`` with small limits, so every error case is cheap to provoke."""
    tmp = tmp_path_factory.mktemp("server")
    srv = start_subprocess_server(
        tmp,
        tiny_vit_repository,
        max_body_bytes=1 << 20,
        max_image_bytes=256 << 10,
        max_image_pixels=1_000_000,
    )
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def thread_server(tiny_vit_repository):
    """Factory: ``with thread_server(**settings) as srv:`` serves a fresh app in this process."""
    from service.process import create_app
    from service.settings import Settings

    def make(**overrides) -> ThreadServer:
        base = {k.removeprefix("ATTNSERVE_").lower(): v for k, v in BASE_ENV.items()}
        settings = Settings(**{"model_repository": tiny_vit_repository, **base, **overrides})
        return ThreadServer(create_app(settings))

    return make


@pytest.fixture
def corrupted_repository(tiny_vit_repository, tmp_path) -> Path:
    """A copy of the repository whose model.onnx had one byte changed after export."""
    repo = tmp_path / "models"
    shutil.copytree(tiny_vit_repository, repo)
    graph = repo / "vit" / "1" / "model.onnx"
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF
    graph.write_bytes(bytes(data))
    return repo


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    """A real redis-server of this module's own (the shared attention store, the response cache)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()
