"""Fixtures of the docs tests: the shipped models served as ``make serve`` serves them, and a reader's folder.

The README and the docs pages tell a reader to run their examples from a clone of the repository with
``make serve`` running and ``shoe.png`` at hand; ``workdir`` is such a folder (``models`` links to the
repository's), and ``server`` is ``python -m service`` on the shipped ``models/``, with its gRPC server on.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.service_testing import ROOT, SubprocessServer, free_port, start_subprocess_server

SHOE = ROOT / "models" / "vit" / "1" / "sample-9-ankle-boot.png"  # Fashion-MNIST test image 0, an ankle boot


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[SubprocessServer]:
    srv = start_subprocess_server(tmp_path_factory.mktemp("docs-server"), ROOT / "models", grpc_port=str(free_port()))
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def workdir(tmp_path) -> Path:
    """A folder holding ``shoe.png``, with ``models`` pointing at the repository's model repository."""
    shutil.copy(SHOE, tmp_path / "shoe.png")
    (tmp_path / "models").symlink_to(ROOT / "models", target_is_directory=True)
    return tmp_path
