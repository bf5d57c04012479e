"""Startup as an operator sees it: ``python -m service`` with a broken repository or an unmet GPU demand."""

from __future__ import annotations

import base64

import httpx

from tests.service.service_testing import start_subprocess_server, wait_until


def _terminal_readiness(srv) -> dict:
    """Poll /readyz until loading has ended (no model pending, loading or warming) and return its body."""

    def settled():
        r = srv.get("/readyz")
        if r is None:
            return None
        body = r.json()
        message = body.get("error", {}).get("message", "")
        busy = any(s in ("pending", "loading", "warming") for s in body.get("models", {}).values())
        return None if busy or "loading the model repository" in message else (r.status_code, r.headers, body)

    return wait_until(settled, what="model loading to end")


def test_a_corrupted_model_file_keeps_the_service_not_ready_with_a_clear_log_line(
    corrupted_repository, tmp_path, fashion_pngs
):
    srv = start_subprocess_server(tmp_path, corrupted_repository)
    try:
        status, _headers, body = _terminal_readiness(srv)
        assert status == 503 and body["models"] == {"vit/1": "failed"}
        assert body["error"]["code"] == "not_ready" and "sha256 mismatch" in body["error"]["message"]
        assert srv.get("/healthz").status_code == 200
        (model,) = srv.get("/models").json()["models"]
        assert model["status"] == "failed" and "sha256 mismatch" in model["reason"]
        r = srv.get("/readyz")  # still not ready later on: nothing retries into a corrupted file
        assert r.status_code == 503
        refused = httpx.post(srv.url + "/classify", json={"images": [base64.b64encode(fashion_pngs[0]).decode()]})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_not_ready"
    finally:
        srv.stop()
    errors = [e for e in srv.logs() if e.get("level") == "error"]
    assert any(
        "vit/1" in e["message"] and "sha256 mismatch" in e["message"] and "model.onnx" in e["message"] for e in errors
    ), errors


def test_an_empty_repository_is_not_ready_and_says_so(tmp_path):
    empty = tmp_path / "models"
    empty.mkdir()
    srv = start_subprocess_server(tmp_path, empty)
    try:
        status, _, body = _terminal_readiness(srv)
    finally:
        srv.stop()
    assert status == 503 and "holds no <name>/<version>/ entries" in body["error"]["message"]


def test_require_gpu_without_cuda_refuses_to_start(tiny_vit_repository, tmp_path):
    cpu_only = tmp_path / "cpu-only"  # the service's onnxruntime offers no CUDA, on any machine
    cpu_only.mkdir()
    (cpu_only / "sitecustomize.py").write_text(
        "import onnxruntime\n"
        "offered = onnxruntime.get_available_providers\n"
        "onnxruntime.get_available_providers = lambda: [p for p in offered() if p != 'CUDAExecutionProvider']\n"
    )
    srv = start_subprocess_server(tmp_path, tiny_vit_repository, python_path=(cpu_only,), require_gpu="true")
    code = srv.proc.wait(timeout=60)
    assert code != 0
    logs = srv.logs()
    assert any("require_gpu is set" in e.get("message", "") + e.get("exc", "") for e in logs), logs
