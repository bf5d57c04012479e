"""A model file that vanishes while the service loads it: that model fails with the reason, the other serves,
and once the file is back the repository poll loads it and the service is ready again."""

from __future__ import annotations

import shutil
import time

import httpx

from tests.faults.drill import Outcome, record
from tests.service.service_testing import start_subprocess_server, wait_until


def test_a_graph_that_vanishes_while_loading_fails_its_model_alone_until_it_is_back(
    both_repository, tmp_path, classify_jobs, translate_jobs
):
    repo = tmp_path / "models"
    shutil.copytree(both_repository, repo)
    srv = start_subprocess_server(tmp_path, repo, faults="load:vanish@1", repository_poll_s="0.5")
    try:
        models = wait_until(lambda: _models_loaded(srv), what="both models tried")
        failed = {m["name"]: m for m in models if m["status"] == "failed"}
        assert set(failed) == {"translator"}  # the first graph opened is the translator's encoder
        assert "encoder.onnx" in failed["translator"]["reason"]
        ready = srv.get("/readyz")
        assert ready.status_code == 503 and "translator/1: failed" in ready.json()["error"]["message"]
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            served = [client.post(path, json=body) for path, body in classify_jobs]
            refused = client.post(translate_jobs[0][0], json=translate_jobs[0][1])
        assert all(r.status_code == 200 for r in served)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_not_ready"
        assert "encoder.onnx" in refused.json()["error"]["message"]

        shutil.copy2(both_repository / "translator" / "1" / "encoder.onnx", repo / "translator" / "1" / "encoder.onnx")
        back = time.monotonic()
        wait_until(lambda: srv.get("/readyz").status_code == 200, timeout=60, what="ready again")
        back_s = time.monotonic() - back
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            translated = client.post(translate_jobs[0][0], json=translate_jobs[0][1])
        assert translated.status_code == 200 and translated.json()["results"][0]["translation"]
    finally:
        srv.stop()
    outcome = Outcome("model-file-vanishes (`load:vanish@1`, the translator's encoder)", [])
    row = {
        **outcome.row(),
        "requests": len(served) + 1,
        "hit": 1,
        "hit_codes": ["503 model_not_ready"],
        "answered": len(served),
        "not_ready_s": round(back_s, 2),
        "note": "not ready until the file is back; ready again that long after it is",
    }
    outcome.row = lambda: row  # the row of a drill whose hit is a refusal, not a failed request
    record(outcome)
    assert back_s < 10.0


def _models_loaded(srv) -> list[dict] | None:
    r = srv.get("/models")
    if r is None or r.status_code != 200:
        return None
    models = r.json()["models"]
    done = all(m["status"] in ("ready", "failed") for m in models) and len(models) == 2
    return models if done else None
