"""End to end: ``python -m service`` on a free port, real onnxruntime, real Fashion-MNIST test images."""

from __future__ import annotations

import base64
import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from service.schemas import ClassifyResponse
from tests.service.service_testing import metric_value, png_bytes, wait_until


@pytest.fixture(scope="module")
def offline_probabilities(tiny_vit_repository, fashion_test) -> np.ndarray:
    """What offline inference says: the export's preprocessing and a plain onnxruntime session."""
    from contract.manifest import Preprocessing

    entry = tiny_vit_repository / "vit" / "1"
    manifest = json.loads((entry / "manifest.json").read_text())
    session = ort.InferenceSession(str(entry / "model.onnx"), providers=["CPUExecutionProvider"])
    images, _ = fashion_test
    (logits,) = session.run(
        ["logits"], {"pixel_values": Preprocessing.model_validate(manifest["preprocessing"]).apply(images)}
    )
    z = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    return np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)


def as_probabilities(result: dict) -> np.ndarray:
    p = np.zeros(len(result["top_k"]))
    for t in result["top_k"]:
        p[t["index"]] = t["score"]
    return p


def json_body(pngs: list[bytes], **options) -> dict:
    return {"images": [base64.b64encode(p).decode() for p in pngs], **options}


def multipart_files(pngs: list[bytes]) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("file", (f"{i}.png", p, "image/png")) for i, p in enumerate(pngs)]


def test_http_answers_agree_with_offline_onnxruntime(server, fashion_pngs, offline_probabilities):
    got = []
    with server.client() as client:
        for start, stop in [(0, 1), (1, 4), (4, 20), (20, 36), (36, 52), (52, 64)]:
            r = client.post("/classify", json=json_body(fashion_pngs[start:stop], top_k=10))
            assert r.status_code == 200, r.text
            body = ClassifyResponse.model_validate(r.json())
            assert (body.model, body.version) == ("vit", "1")
            got += [as_probabilities(res) for res in r.json()["results"]]
    got = np.stack(got)
    np.testing.assert_allclose(got, offline_probabilities, atol=1e-5)
    assert (got.argmax(1) == offline_probabilities.argmax(1)).all()


def test_top_k_is_best_first_and_of_the_requested_length(server, fashion_pngs, offline_probabilities):
    with server.client() as client:
        r = client.post("/classify", json=json_body(fashion_pngs[:2], top_k=3))
    for res, p in zip(r.json()["results"], offline_probabilities):
        assert [t["index"] for t in res["top_k"]] == list(np.argsort(-p, kind="stable")[:3])
        assert next(t["label"] for t in res["top_k"]) and len(res["top_k"]) == 3


def test_json_and_multipart_give_the_same_answer(server, fashion_pngs):
    pngs = fashion_pngs[:8]
    with server.client() as client:
        as_json = client.post("/classify", json=json_body(pngs, top_k=4, model="vit")).json()
        as_form = client.post("/classify", files=multipart_files(pngs), data={"top_k": "4", "model": "vit"}).json()
    assert [[t["index"] for t in r["top_k"]] for r in as_json["results"]] == [
        [t["index"] for t in r["top_k"]] for r in as_form["results"]
    ]
    np.testing.assert_allclose(
        [[t["score"] for t in r["top_k"]] for r in as_json["results"]],
        [[t["score"] for t in r["top_k"]] for r in as_form["results"]],
        atol=1e-6,
    )
    assert (as_json["model"], as_json["version"]) == (as_form["model"], as_form["version"])


def test_batch_priority_answers_the_same_as_json_as_a_form_and_over_the_protocol(server, fashion_pngs):
    pngs = fashion_pngs[:4]
    with server.client() as client:
        interactive = client.post("/classify", json=json_body(pngs, top_k=3)).json()
        batch = client.post("/classify", json=json_body(pngs, top_k=3, priority="batch")).json()
        form = client.post("/classify", files=multipart_files(pngs), data={"top_k": "3", "priority": "batch"})
        refused = client.post("/classify", json=json_body(pngs, priority="urgent"))
        oip = {
            "inputs": [{"name": "images", "shape": [1], "datatype": "BYTES", "data": [_b64(pngs[0])]}],
            "parameters": {"priority": "batch"},
        }
        over_oip = client.post("/v2/models/vit/infer", json=oip)
        bad_oip = client.post("/v2/models/vit/infer", json={**oip, "parameters": {"priority": "soon"}})
    labels = [[t["index"] for t in r["top_k"]] for r in interactive["results"]]
    assert [[t["index"] for t in r["top_k"]] for r in batch["results"]] == labels
    assert form.status_code == 200 and [[t["index"] for t in r["top_k"]] for r in form.json()["results"]] == labels
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "invalid_field"
    assert over_oip.status_code == 200, over_oip.text
    assert bad_oip.status_code == 422 and "priority" in bad_oip.json()["error"]


def test_32_concurrent_clients_all_get_their_own_correct_answer_in_shared_batches(
    server, fashion_pngs, offline_probabilities
):
    before = server.get("/metrics").text

    def client_session(worker: int) -> list[tuple[int, np.ndarray]]:
        answers = []
        with server.client() as client:
            for round_ in range(4):
                i = (worker * 4 + round_) % len(fashion_pngs)
                r = client.post("/classify", json=json_body([fashion_pngs[i]], top_k=10))
                assert r.status_code == 200, r.text
                answers.append((i, as_probabilities(r.json()["results"][0])))
        return answers

    with ThreadPoolExecutor(max_workers=32) as pool:
        answers = [a for session in pool.map(client_session, range(32)) for a in session]
    assert len(answers) == 128
    for i, p in answers:
        np.testing.assert_allclose(p, offline_probabilities[i], atol=1e-5)
    after = server.get("/metrics").text
    batches = metric_value(after, "attnserve_batch_size_count", model="vit") - metric_value(
        before, "attnserve_batch_size_count", model="vit"
    )
    singles = metric_value(after, "attnserve_batch_size_bucket", model="vit", le="1.0") - metric_value(
        before, "attnserve_batch_size_bucket", model="vit", le="1.0"
    )
    assert 0 < batches < 128, "128 single-image requests from 32 clients must share onnxruntime runs"
    assert batches - singles > 0, "the batch-size histogram shows no batch of more than one image"


def test_models_lists_the_model_with_the_provider_in_use(server):
    r = server.get("/models")
    assert r.status_code == 200
    (vit,) = r.json()["models"]
    assert vit["name"] == "vit" and vit["version"] == "1" and vit["task"] == "image-classification"
    assert vit["status"] == "ready" and vit["default"] is True and vit["reason"] is None
    assert vit["provider"] == "CPUExecutionProvider"
    assert vit["input"] == {"image_size": 28, "channels": 1, "color_mode": "L"}
    assert len(vit["labels"]) == 10 and "test_accuracy" in vit["evaluation"]
    assert vit["max_batch_size"] == 16


def test_health_and_readiness(server):
    assert server.get("/healthz").json() == {"status": "ok"}
    ready = server.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "models": {"vit/1": "ready"}}


def test_metrics_report_requests_latency_queue_compute_and_provider(server, fashion_pngs):
    with server.client() as client:
        client.post("/classify", json=json_body(fashion_pngs[:1]))
        client.post("/classify", json={"images": []})
    text = server.get("/metrics").text
    assert metric_value(text, "attnserve_http_requests_total", route="/classify", status="200") >= 1
    assert metric_value(text, "attnserve_http_requests_total", route="/classify", status="422") >= 1
    assert metric_value(text, "attnserve_http_request_duration_seconds_count", route="/classify") >= 2
    assert metric_value(text, "attnserve_queue_wait_seconds_count", model="vit") >= 1
    assert metric_value(text, "attnserve_compute_seconds_count", model="vit") >= 1
    assert metric_value(text, "attnserve_model_provider_info", model="vit", provider="CPUExecutionProvider") == 1
    assert metric_value(text, "attnserve_model_ready", model="vit") == 1


def test_request_id_is_accepted_or_generated_and_returned_and_logged(server, fashion_pngs):
    with server.client() as client:
        given = client.post("/classify", json=json_body(fashion_pngs[:1]), headers={"X-Request-ID": "trace-42.a"})
        generated = client.get("/healthz")
        forged = client.get("/healthz", headers={"X-Request-ID": 'x" level=error'})
    assert given.headers["x-request-id"] == "trace-42.a"
    assert re.fullmatch(r"[0-9a-f]{32}", generated.headers["x-request-id"])
    assert re.fullmatch(r"[0-9a-f]{32}", forged.headers["x-request-id"])  # unsafe ids are replaced

    def access_line():  # access lines are written in batches, within AccessLog.FLUSH_AFTER_S
        lines = [e for e in server.logs() if e.get("request_id") == "trace-42.a"]
        return any(e.get("path") == "/classify" and e.get("status") == 200 and "duration_ms" in e for e in lines)

    wait_until(access_line, timeout=10, what="the request's access line")


def test_openapi_documents_both_request_encodings(server):
    spec = server.get("/openapi.json").json()
    content = spec["paths"]["/classify"]["post"]["requestBody"]["content"]
    assert {"application/json", "multipart/form-data"} <= set(content)
    assert server.get("/docs").status_code == 200


# ---- every error case: its status, its stable code, the JSON error body, no stack trace ----------------
def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _png(width: int, height: int) -> bytes:
    return png_bytes(np.zeros((height, width), np.uint8))


def _noise_png(side: int) -> bytes:
    return png_bytes(np.random.default_rng(0).integers(0, 256, (side, side), dtype=np.uint8))


ERROR_CASES = {
    "undecodable image": ({"json": {"images": [_b64(b"not an image at all")]}}, 400, "undecodable_image"),
    "truncated image": ({"json": {"images": [_b64(_png(28, 28)[:40])]}}, 400, "undecodable_image"),
    "invalid base64": ({"json": {"images": ["@@@not-base64@@@"]}}, 400, "invalid_base64"),
    "invalid JSON": ({"content": b"{nope", "headers": {"Content-Type": "application/json"}}, 400, "invalid_json"),
    "malformed multipart": (
        {"content": b"garbage", "headers": {"Content-Type": "multipart/form-data"}},
        400,
        "invalid_multipart",
    ),
    "unknown model": ({"json": {"images": [_b64(_png(28, 28))], "model": "nope"}}, 404, "model_not_found"),
    "body too large": (
        {"content": b"x" * ((1 << 20) + 1), "headers": {"Content-Type": "application/json"}},
        413,
        "body_too_large",
    ),
    "image too many bytes": ({"files": [("file", ("n.png", _noise_png(600), "image/png"))]}, 413, "image_too_large"),
    "image too many pixels": ({"json": {"images": [_b64(_png(1001, 1000))]}}, 413, "image_too_large"),
    "unsupported content type": (
        {"content": b"hello", "headers": {"Content-Type": "text/plain"}},
        415,
        "unsupported_media_type",
    ),
    "no content type": ({"content": b""}, 415, "unsupported_media_type"),
    "top_k zero": ({"json": {"images": [_b64(_png(28, 28))], "top_k": 0}}, 422, "invalid_field"),
    "top_k above labels": ({"json": {"images": [_b64(_png(28, 28))], "top_k": 11}}, 422, "invalid_field"),
    "top_k not a number": (
        {"files": [("file", ("a.png", _png(28, 28), "image/png"))], "data": {"top_k": "many"}},
        422,
        "invalid_field",
    ),
    "too many images": ({"json": {"images": [_b64(_png(28, 28))] * 17}}, 422, "invalid_field"),
    "no images": ({"json": {"images": []}}, 422, "invalid_field"),
    "images not a list": ({"json": {"images": "abc"}}, 422, "invalid_field"),
    "unknown field": ({"json": {"images": [_b64(_png(28, 28))], "topk": 3}}, 422, "invalid_field"),
    "rollout fusion": (
        {"json": {"images": [_b64(_png(28, 28))], "return_attention": True, "rollout_fusion": "min"}},
        422,
        "invalid_field",
    ),
    "multipart without file": ({"files": [("image", ("a.png", _png(28, 28), "image/png"))]}, 422, "invalid_field"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_every_error_case_answers_its_status_and_json_body(server, case):
    kwargs, status, code = ERROR_CASES[case]
    with server.client() as client:
        r = client.post("/classify", **kwargs)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == code and body["error"]["message"]
    assert "Traceback" not in r.text and 'File "' not in r.text


@pytest.mark.parametrize(
    "method, path, status, code",
    [
        ("GET", "/nope", 404, "not_found"),
        ("GET", "/classify", 405, "method_not_allowed"),
        ("DELETE", "/models", 405, "method_not_allowed"),
    ],
)
def test_unknown_routes_and_methods_answer_json_errors_too(server, method, path, status, code):
    r = httpx.request(method, server.url + path)
    assert r.status_code == status
    assert r.json()["error"]["code"] == code
    if status == 405:
        assert "POST" in r.headers["allow"] or "GET" in r.headers["allow"]
