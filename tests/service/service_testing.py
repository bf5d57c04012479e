"""Helpers shared by the service tests: free ports, servers (subprocess or thread), metric parsing.

Kept out of conftest.py so test modules can import them by name (pytest puts this folder on
``sys.path``); the fixtures built on them live in conftest.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from PIL import Image
from typing_extensions import Self

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60.0

# Settings every test server uses unless a test overrides them: one onnxruntime thread leaves a
# core for the test client on a 2-core machine.
BASE_ENV = {
    "ATTNSERVE_GRPC_PORT": "0",  # no gRPC server unless a test asks for one (on a free port)
    "ATTNSERVE_DRAIN_DELAY_S": "0",  # nothing balances a test server: SIGTERM stops it at once (test_drain.py waits)
    "ATTNSERVE_INTRA_OP_THREADS": "1",
    "ATTNSERVE_MAX_BATCH_SIZE": "16",
    "ATTNSERVE_MAX_IMAGES_PER_REQUEST": "16",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float = STARTUP_TIMEOUT_S, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; a generous bound, never a timing assertion."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f} s")


def png_bytes(pixels: np.ndarray, fmt: str = "PNG", **save_args) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt, **save_args)
    return buf.getvalue()


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` in a Prometheus text page."""
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
            found = True
    return total if found else 0.0


@dataclass
class Server:
    url: str
    log_path: Path | None = None
    grpc: str | None = None  # host:port of its gRPC server, when it runs one

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30.0, **kwargs)

    def logs(self) -> list[dict]:
        if self.log_path is None:
            return []
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                out.append({"message": line, "level": "raw"})
        return out

    def get(self, path: str) -> httpx.Response | None:
        try:
            return httpx.get(self.url + path, timeout=5.0)
        except httpx.TransportError:
            return None

    def wait_ready(self) -> None:
        wait_until(lambda: (r := self.get("/readyz")) is not None and r.status_code == 200, what=f"{self.url}/readyz")


@dataclass
class SubprocessServer(Server):
    proc: subprocess.Popen | None = None

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def start_subprocess_server(
    tmp_path: Path, repository: Path, root: Path = ROOT, python_path: tuple[Path, ...] = (), **settings: str
) -> SubprocessServer:
    """``python -m service`` of the source tree ``root`` (this checkout unless another build is wanted);
    ``python_path``: folders imported from first (a ``sitecustomize`` there runs before the service)."""
    port = free_port()
    env = {
        **os.environ,
        **BASE_ENV,
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(map(str, (*python_path, root, ROOT)))),
        "ATTNSERVE_PORT": str(port),
        "ATTNSERVE_MODEL_REPOSITORY": str(repository),
        "ATTNSERVE_LOG_FORMAT": "json",
        **{f"ATTNSERVE_{k.upper()}": str(v) for k, v in settings.items()},
    }
    log_path = tmp_path / f"server-{port}.log"
    log_file = open(log_path, "w")  # noqa: SIM115 - owned by the process, closed with it
    proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=root, env=env, stdout=log_file, stderr=log_file)
    log_file.close()
    grpc = f"127.0.0.1:{settings['grpc_port']}" if int(settings.get("grpc_port", 0)) else None
    return SubprocessServer(url=f"http://127.0.0.1:{port}", log_path=log_path, grpc=grpc, proc=proc)


@contextlib.contextmanager
def serving(tmp_path: Path, repository: Path, **settings: str) -> Iterator[SubprocessServer]:
    """``python -m service`` on ``repository``, ready, stopped on exit."""
    srv = start_subprocess_server(tmp_path, repository, **settings)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


class ThreadServer(Server):
    """uvicorn serving ``app`` in a background thread of the test process."""

    def __init__(self, app) -> None:
        import uvicorn

        port = free_port()
        super().__init__(url=f"http://127.0.0.1:{port}")
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="uvicorn-test", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        wait_until(lambda: self._server.started or not self._thread.is_alive(), what="uvicorn to start")
        if not self._server.started:
            raise RuntimeError("uvicorn did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)


class RedisServer:
    """``redis-server`` (Debian's package, installed by ``make system-deps``) on a loopback port."""

    def __init__(self, workdir: Path) -> None:
        self.exe = shutil.which("redis-server")
        assert self.exe, "redis-server is not installed: run `make system-deps`"
        self.port, self.workdir, self.proc = free_port(), workdir, None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            "--maxmemory",
            "64mb",
            "--maxmemory-policy",
            "allkeys-lru",
        ]
        self.proc = subprocess.Popen([self.exe, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._accepts, timeout=20, what=f"redis-server on port {self.port}")

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
