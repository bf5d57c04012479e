"""SIGTERM to ``python -m service`` drains in the order a load balancer needs (``service/process.py``):
at once its readiness says no, over HTTP and gRPC, while both go on answering; only after
``ATTNSERVE_DRAIN_DELAY_S`` do they stop accepting, and the process ends within the delay and its
drain. A second signal ends the delay at once."""

from __future__ import annotations

import shutil
import signal
import socket
import time

import httpx
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import ROOT
from tests.service.grpc.test_grpc import images_input
from tests.service.service_testing import free_port, start_subprocess_server, wait_until

SAMPLE = ROOT / "models" / "vit" / "1" / "sample-9-ankle-boot.png"


@pytest.fixture(scope="module")
def vit_repository(tmp_path_factory):
    """The shipped ViT alone: a repository that loads in a second or two."""
    repo = tmp_path_factory.mktemp("drain") / "models"
    shutil.copytree(ROOT / "models" / "vit", repo / "vit")
    return repo


def accepts(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) == 0


def draining(srv) -> bool:
    return (r := srv.get("/readyz")) is not None and r.status_code == 503


def classify(url: str) -> httpx.Response:
    return httpx.post(f"{url}/classify", files={"file": ("shoe.png", SAMPLE.read_bytes(), "image/png")}, timeout=10)


def test_sigterm_says_draining_keeps_answering_then_stops_accepting_after_the_delay(vit_repository, tmp_path):
    delay = 4.0
    srv = start_subprocess_server(tmp_path, vit_repository, grpc_port=str(free_port()), drain_delay_s=str(delay))
    try:
        srv.wait_ready()
        client = grpcclient.InferenceServerClient(srv.grpc)
        assert client.is_server_ready() and client.is_model_ready("vit")
        srv.proc.send_signal(signal.SIGTERM)
        sigterm = time.monotonic()

        wait_until(lambda: draining(srv), timeout=2, what="/readyz 503")
        ready = srv.get("/readyz")
        assert ready.json()["status"] == "draining" and ready.json()["error"]["code"] == "draining", ready.text
        assert srv.get("/v2/health/ready").status_code == 503
        assert srv.get("/healthz").status_code == 200  # alive: nothing should restart it
        answer = classify(srv.url)  # a new connection, a new request: answered
        assert answer.status_code == 200 and answer.json()["results"][0]["top_k"][0]["label"] == "Ankle boot"
        assert not client.is_server_ready() and not client.is_model_ready("vit")
        result = client.infer("vit", [images_input([SAMPLE.read_bytes()])])  # a gRPC call: answered
        assert result.as_numpy("probabilities") is not None
        fresh = grpcclient.InferenceServerClient(srv.grpc)  # a new gRPC connection too
        assert fresh.is_server_live() and not fresh.is_server_ready()
        checked = time.monotonic() - sigterm
        assert checked < delay, f"the checks took {checked:.1f} s, longer than the delay: nothing was tested"

        wait_until(lambda: not accepts(srv.url), timeout=delay + 5, interval=0.02, what="the listener to close")
        refused = time.monotonic() - sigterm
        assert refused > delay - 0.5, f"stopped accepting {refused:.2f} s after SIGTERM, before the delay ({delay} s)"
        # uvicorn re-raises the signal once it has shut down gracefully (as PID 1 of a container: exit 0)
        assert srv.proc.wait(timeout=10) in (0, -signal.SIGTERM)
        ended = time.monotonic() - sigterm
        assert ended < delay + 5, f"ended {ended:.1f} s after SIGTERM"
    finally:
        srv.stop()


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_ends_the_delay(vit_repository, tmp_path, second):
    srv = start_subprocess_server(tmp_path, vit_repository, grpc_port=str(free_port()), drain_delay_s="60")
    try:
        srv.wait_ready()
        srv.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: draining(srv), timeout=5, what="/readyz 503")
        assert classify(srv.url).status_code == 200  # still accepting: the 60 s delay runs
        srv.proc.send_signal(second)
        stopped = time.monotonic()
        assert srv.proc.wait(timeout=10) in (0, -signal.SIGTERM, -signal.SIGINT)
        assert time.monotonic() - stopped < 10
        logs = [e.get("message", "") for e in srv.logs()]
        assert any("second signal" in m for m in logs), logs[-20:]
        assert any(m == "stopped" for m in logs), "the core did not stop in order (the lifespan's shutdown)"
    finally:
        srv.stop()
