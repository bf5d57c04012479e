"""The Open Inference Protocol on a real server (``python -m service`` on the shipped models), through
the real ``tritonclient[http]`` package and through plain httpx: the same answers as the native routes."""

from __future__ import annotations

import base64
import io
import json
import struct

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from PIL import Image
from tritonclient.utils import InferenceServerException

from contract.manifest import load_entry
from contract.placeholders import find_spans
from tests.conftest import ROOT
from tests.service.service_testing import metric_value, serving

SHIPPED = ROOT / "models"
TEXTS = ["Open the file.", "Save the current document."]
SHORT = b'{"inputs": [{"name": "images", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 9}}]}'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    limits = {"max_images_per_request": 8, "max_body_bytes": 1 << 20, "max_image_bytes": 256 << 10}
    with serving(tmp_path_factory.mktemp("oip"), SHIPPED, **limits) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    c = triton.InferenceServerClient(server.url.removeprefix("http://"))
    yield c
    c.close()


@pytest.fixture(scope="module")
def pngs(server) -> list[bytes]:
    samples = httpx.get(server.url + "/samples").json()["images"]
    return [httpx.get(server.url + s["url"]).content for s in samples[:4]]


def text(v: bytes | str) -> str:
    """A BYTES element as tritonclient returns it: bytes from binary data, str from JSON."""
    return v.decode() if isinstance(v, bytes) else v


def native_top_k(server, pngs, k) -> list[list[str]]:
    body = {"images": [base64.b64encode(p).decode() for p in pngs], "top_k": k}
    results = httpx.post(server.url + "/classify", json=body).json()["results"]
    return [[f"{t['score']}:{t['index']}:{t['label']}" for t in r["top_k"]] for r in results]


def test_health_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("vit") and client.is_model_ready("vit", "1") and client.is_model_ready("translator")
    assert not client.is_model_ready("vit", "9") and not client.is_model_ready("nope")
    assert set(client.get_server_metadata()["extensions"]) >= {"binary_tensor_data", "classification"}
    vit = client.get_model_metadata("vit", "1")
    assert vit["versions"] == ["1"]
    assert {(t["name"], t["datatype"], tuple(t["shape"])) for t in vit["inputs"]} == {
        ("images", "BYTES", (-1,)),
        ("pixels", "FP32", (-1, 1, 28, 28)),
    }
    assert ("probabilities", "FP64", [-1, 10]) in [(t["name"], t["datatype"], t["shape"]) for t in vit["outputs"]]
    translator = client.get_model_metadata("translator")
    assert [t["name"] for t in translator["inputs"]] == ["text"]
    with pytest.raises(InferenceServerException, match="is not loaded") as e:
        client.get_model_metadata("nope")
    assert e.value.status() == "404"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_classification_matches_the_native_route(server, client, pngs, binary):
    images = triton.InferInput("images", [len(pngs)], "BYTES")
    rows = pngs if binary else [base64.b64encode(p) for p in pngs]  # JSON carries no raw bytes
    images.set_data_from_numpy(np.array(rows, dtype=object), binary_data=binary)
    top = triton.InferRequestedOutput("probabilities", binary_data=binary, class_count=3)
    result = client.infer("vit", [images], outputs=[top])
    answered = [[text(v) for v in row] for row in result.as_numpy("probabilities")]
    assert answered == native_top_k(server, pngs, 3)
    probabilities = client.infer("vit", [images], outputs=[triton.InferRequestedOutput("probabilities", binary)])
    p = probabilities.as_numpy("probabilities")
    assert p.shape == (len(pngs), 10) and p.dtype == np.float64
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
    assert [float(p[i].max()) for i in range(len(pngs))] == [float(r[0].split(":")[0]) for r in answered]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_preprocessed_pixels_give_the_same_answer_as_the_image(server, client, pngs, binary):
    image = triton.InferInput("images", [1], "BYTES")
    image.set_data_from_numpy(np.array(pngs[:1], dtype=object))
    from_image = client.infer("vit", [image]).as_numpy("probabilities")
    # the pixels as the model was trained on them: the manifest's normalisation of the decoded image
    prep = load_entry(SHIPPED / "vit" / "1").manifest.preprocessing
    grey = np.asarray(Image.open(io.BytesIO(pngs[0])).convert("L"), np.float32)[None, None]
    x = ((grey * np.float32(prep.scale) - np.float32(prep.mean[0])) / np.float32(prep.std[0])).astype(np.float32)
    tensor = triton.InferInput("pixels", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    from_pixels = client.infer("vit", [tensor]).as_numpy("probabilities")
    np.testing.assert_array_equal(from_pixels, from_image)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_translation_matches_the_native_route_with_decoding_parameters(server, client, binary):
    texts = triton.InferInput("text", [len(TEXTS)], "BYTES")
    texts.set_data_from_numpy(np.array(TEXTS, dtype=object), binary_data=binary)
    wanted = triton.InferRequestedOutput("translation", binary_data=binary)
    result = client.infer(
        "translator", [texts], outputs=[wanted], parameters={"beam_size": 4, "num_return_sequences": 2}
    )
    answered = [[text(v) for v in row] for row in result.as_numpy("translation")]
    native = httpx.post(server.url + "/translate", json={"texts": TEXTS, "beam_size": 4, "num_return_sequences": 2})
    assert answered == [[h["translation"] for h in r["nbest"]] for r in native.json()["results"]]
    greedy = client.infer("translator", [texts]).as_numpy("translation")
    native = httpx.post(server.url + "/translate", json={"texts": TEXTS}).json()["results"]
    assert [text(v) for v in greedy] == [r["translation"] for r in native]


def test_placeholders_come_back_over_oip_rest(server, client):
    strings = ["Could not open file %s.", "Press <b>Enter</b> to continue."]
    texts = triton.InferInput("text", [2], "BYTES")
    texts.set_data_from_numpy(np.array(strings, dtype=object))
    raw = client.infer("translator", [texts], parameters={"protect_placeholders": False}).as_numpy("translation")
    native = httpx.post(server.url + "/translate", json={"texts": strings, "protect_placeholders": False}).json()
    assert [text(v) for v in raw] == [r["translation"] for r in native["results"]]
    answered = [text(v) for v in client.infer("translator", [texts]).as_numpy("translation")]
    assert all(
        sorted(s.text for s in find_spans(a)) == sorted(s.text for s in find_spans(t))
        for a, t in zip(answered, strings)
    )


def test_return_attention_adds_ids_the_attention_route_serves(server, client, pngs):
    images = triton.InferInput("images", [2], "BYTES")
    images.set_data_from_numpy(np.array(pngs[:2], dtype=object))
    ids = client.infer("vit", [images], parameters={"return_attention": True}).as_numpy("attention_id")
    one = triton.InferInput("text", [1], "BYTES")
    one.set_data_from_numpy(np.array(TEXTS[:1], dtype=object))
    ids = [*ids, *client.infer("translator", [one], parameters={"return_attention": True}).as_numpy("attention_id")]
    assert len(ids) == 3
    tasks = [httpx.get(f"{server.url}/attention/{i.decode()}").json()["task"] for i in ids]
    assert tasks == ["image-classification", "image-classification", "translation"]


def raw_infer(server, model: str, body: bytes, **headers) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/models/{model}/infer", content=body, headers=headers)


def bytes_tensor(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def test_plain_http_binary_request_and_response(server, pngs):
    """The binary extension by hand: JSON header, then each input's bytes; binary outputs come back the same way."""
    data = bytes_tensor(*pngs[:2])
    header = (
        b'{"id": "r-7", "inputs": [{"name": "images", "shape": [2], "datatype": "BYTES", '
        b'"parameters": {"binary_data_size": %d}}], "outputs": [{"name": "probabilities", '
        b'"parameters": {"binary_data": true}}]}' % len(data)
    )
    r = raw_infer(server, "vit", header + data, **{"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    split = int(r.headers["inference-header-content-length"])
    doc = json.loads(r.content[:split])
    assert doc["id"] == "r-7" and doc["model_name"] == "vit" and doc["model_version"] == "1"
    (out,) = doc["outputs"]
    p = np.frombuffer(r.content[split:], "<f8").reshape(out["shape"])
    assert out["parameters"]["binary_data_size"] == 2 * 10 * 8 and np.allclose(p.sum(axis=1), 1)


@pytest.mark.parametrize(
    ("model", "body", "headers", "status", "message"),
    [
        ("vit", b"{nope", {}, 400, "not valid JSON"),
        ("vit", b'{"inputs": []}', {}, 422, "non-empty `inputs`"),
        ("vit", b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}', {}, 422, "images or pixels"),
        ("vit", b'{"inputs": [{"name": "pixels", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0]}]}', {}, 422, "needs 784 elements"),
        ("vit", b'{"inputs": [{"name": "pixels", "shape": [1, 3], "datatype": "FP32", "data": [0, 0, 0]}]}', {}, 422, "FP32 [N, 1, 28, 28]"),
        ("vit", b'{"inputs": [{"name": "images", "shape": [1], "datatype": "BYTES", "data": ["%%%"]}]}', {}, 400, "base64"),
        ("vit", b'{"inputs": [{"name": "images", "shape": [1], "datatype": "BYTES", "data": ["aGVsbG8="]}]}', {}, 400, "not an image"),
        ("vit", SHORT + b"abc", {"Inference-Header-Content-Length": str(len(SHORT))}, 422, "exceeds the binary data left"),
        ("vit", SHORT, {"Inference-Header-Content-Length": str(len(SHORT) + 1)}, 422, "does not fit a body"),
        ("vit", b'{"inputs": [{"name": "images", "shape": [9], "datatype": "BYTES", "data": ["a","a","a","a","a","a","a","a","a"]}]}', {}, 422, "at most 8"),
        ("translator", b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["Hi."]}], "parameters": {"beam_size": 0}}', {}, 422, "beam_size"),
        ("translator", b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["Hi."]}], "outputs": [{"name": "logits"}]}', {}, 422, "no output"),
        ("nope", b'{"inputs": []}', {}, 404, "is not loaded"),
    ],
)  # fmt: skip
def test_bad_requests_get_the_protocol_error_body_and_the_service_goes_on(
    server, model, body, headers, status, message
):
    r = raw_infer(server, model, body, **headers)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and message in r.json()["error"]
    assert (
        raw_infer(
            server, "translator", b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["Hi."]}]}'
        ).status_code
        == 200
    )


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "message"),
    [
        ("GET", "/v2/nope", None, {}, 404, "no route GET /v2/nope"),
        ("GET", "/v2/", None, {}, 404, "no route GET /v2/"),
        ("GET", "/v2/models/vit/infer", None, {}, 405, "Method Not Allowed"),
        ("DELETE", "/v2/models/vit", None, {}, 405, "Method Not Allowed"),
        ("GET", "/v2/models/nope", None, {}, 404, "model 'nope' is not loaded"),
        ("GET", "/v2/models/vit/versions/9/ready", None, {}, 404, "model 'vit' version '9' is not loaded"),
        ("POST", "/v2/models/vit/infer", b"{nope", {}, 400, "not valid JSON"),
        ("POST", "/v2/repository/index", b"[1]", {}, 422, "must be a JSON object"),
        ("POST", "/v2/repository/index", b'{"ready": 1}', {}, 422, "`ready` must be true or false"),
        ("POST", "/v2/models/vit/infer", b"{}", {"Content-Encoding": "gzip"}, 415, "uncompressed"),
        ("POST", "/v2/models/vit/infer", b" " * ((1 << 20) + 1), {}, 413, "exceeds the limit of 1048576 bytes"),
    ],
)  # fmt: skip
def test_every_error_under_v2_has_the_protocol_body(server, method, path, body, headers, status, message):
    """Whichever part of the service refuses the request (router, body limit, handler), the body is
    ``{"error": "<message>"}``, the only form Triton's and KServe's clients read."""
    r = httpx.request(method, server.url + path, content=body, headers=headers)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert list(r.json()) == ["error"] and message in r.json()["error"], r.text
    if status == 405:
        assert r.headers["allow"] == ("POST" if path.endswith("/infer") else "GET, HEAD")


def test_tritonclient_formats_every_error_it_gets(server, client):
    """``InferenceServerException`` carries the message (a native body made tritonclient raise TypeError)."""
    for call in (lambda: client.get_model_config("nope"), lambda: client.get_inference_statistics("nope")):
        with pytest.raises(InferenceServerException) as e:
            call()
        assert e.value.status() == "404"
        assert "is not loaded" in str(e.value) or "no route GET /v2/models/nope/" in str(e.value)
    assert httpx.get(server.url + "/nope").json()["error"]["code"] == "not_found"  # elsewhere: the service's body


def test_oip_requests_are_counted_under_their_route_templates(server, client):
    client.is_server_live()
    metrics = httpx.get(server.url + "/metrics").text
    assert (
        metric_value(metrics, "attnserve_http_requests_total", route="/v2/health/live", method="GET", status="200") >= 1
    )
    assert (
        metric_value(
            metrics, "attnserve_http_requests_total", route="/v2/models/{name}/infer", method="POST", status="200"
        )
        >= 1
    )
