"""Fixtures of the SDK tests: both clients side by side, and a real service to talk to.

The service is ``python -m service`` in a subprocess, exactly as a user runs it, serving the
repository's shipped model repository (``models/``: the ViT and the translator the README's examples
use). It starts in seconds, where the tiny models of tests/conftest.py would first have to be trained.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.client.sdk_testing import make
from tests.service.service_testing import ROOT, SubprocessServer, png_bytes, start_subprocess_server


@pytest.fixture(params=["sync", "async"])
def make_client(request):
    """Factory of ``Client`` (sync) or ``AsyncClient`` (async, behind a blocking face); closed after the test."""
    made = []

    def factory(handler=None, **kwargs):
        client = make(request.param, handler, **kwargs)
        made.append(client)
        return client

    yield factory
    for client in made:
        client.close()


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Iterator[SubprocessServer]:
    srv = start_subprocess_server(tmp_path_factory.mktemp("sdk-server"), ROOT / "models")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def api(make_client, server):
    """A client of each kind connected to the real server."""
    return make_client(base_url=server.url, timeout=60)


@pytest.fixture(scope="session")
def shoe(fashion_mnist, tmp_path_factory) -> Path:
    """A real Fashion-MNIST test image (an ankle boot) as a PNG file."""
    path = tmp_path_factory.mktemp("images") / "shoe.png"
    path.write_bytes(png_bytes(fashion_mnist.test_images[0][..., 0]))
    return path
