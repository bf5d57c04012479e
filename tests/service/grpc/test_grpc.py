"""The Open Inference Protocol over gRPC on a real server (``python -m service`` on the shipped models, its
gRPC server on a free port of 127.0.0.1), through the real ``tritonclient.grpc`` (sync and aio) and,
for comparison, ``tritonclient.http`` and the native routes: the same answers, errors as gRPC codes."""

from __future__ import annotations

import asyncio
import base64
import queue

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from contract.placeholders import find_spans
from tests.conftest import ROOT
from tests.service.service_testing import free_port, metric_value, serving

SHIPPED = ROOT / "models"
TEXTS = ["Open the file.", "Save the current document."]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    limits = {"max_images_per_request": 8, "max_body_bytes": 1 << 20, "max_image_bytes": 256 << 10}
    with serving(tmp_path_factory.mktemp("grpc"), SHIPPED, grpc_port=str(free_port()), **limits) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    c = grpcclient.InferenceServerClient(server.grpc)
    yield c
    c.close()


@pytest.fixture(scope="module")
def pngs(server) -> list[bytes]:
    samples = httpx.get(server.url + "/samples").json()["images"]
    return [httpx.get(server.url + s["url"]).content for s in samples[:4]]


def texts_input(texts: list[str]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object))
    return tensor


def images_input(pngs: list[bytes]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("images", [len(pngs)], "BYTES")
    tensor.set_data_from_numpy(np.array(pngs, dtype=object))
    return tensor


def native_top_k(server, pngs, k) -> list[list[str]]:
    body = {"images": [base64.b64encode(p).decode() for p in pngs], "top_k": k}
    results = httpx.post(server.url + "/classify", json=body).json()["results"]
    return [[f"{t['score']}:{t['index']}:{t['label']}" for t in r["top_k"]] for r in results]


def code(error: InferenceServerException) -> str:
    return error.status().removeprefix("StatusCode.")


def test_health_metadata_and_configuration_are_the_rest_ones(server, client):
    rest = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("vit") and client.is_model_ready("vit", "1") and client.is_model_ready("translator")
    assert not client.is_model_ready("vit", "9") and not client.is_model_ready("nope")
    assert client.get_server_metadata(as_json=True)["extensions"] == rest.get_server_metadata()["extensions"]
    for model in ("vit", "translator"):
        metadata = client.get_model_metadata(model, as_json=True)
        for tensors in ("inputs", "outputs"):
            for t in metadata[tensors]:
                t["shape"] = [int(d) for d in t["shape"]]  # int64 is a string in protobuf's JSON
        assert metadata == rest.get_model_metadata(model)
        config, expected = client.get_model_config(model).config, rest.get_model_config(model)
        assert config.max_batch_size == expected["max_batch_size"]
        assert [(t.name, list(t.dims)) for t in config.input] == [(t["name"], t["dims"]) for t in expected["input"]]
        assert config.dynamic_batching.max_queue_delay_microseconds == expected["dynamic_batching"]["max_queue_delay_microseconds"]  # fmt: skip
    with pytest.raises(InferenceServerException, match="is not loaded") as e:
        client.get_model_metadata("nope")
    assert code(e.value) == "NOT_FOUND"
    rest.close()


def test_classification_binary_tensors_and_the_classification_extension(server, client, pngs):
    top = grpcclient.InferRequestedOutput("probabilities", class_count=3)
    answered = client.infer("vit", [images_input(pngs)], outputs=[top]).as_numpy("probabilities")
    assert [[v.decode() for v in row] for row in answered] == native_top_k(server, pngs, 3)
    p = client.infer("vit", [images_input(pngs)]).as_numpy("probabilities")
    assert p.shape == (len(pngs), 10) and p.dtype == np.float64
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
    pixels = grpcclient.InferInput("pixels", [1, 1, 28, 28], "FP32")
    pixels.set_data_from_numpy(np.zeros((1, 1, 28, 28), np.float32))
    assert client.infer("vit", [pixels]).as_numpy("probabilities").shape == (1, 10)


def test_translation_nbest_and_attention_ids(server, client):
    result = client.infer(
        "translator",
        [texts_input(TEXTS)],
        parameters={"beam_size": 4, "num_return_sequences": 2, "return_attention": True},
    )
    native = httpx.post(server.url + "/translate", json={"texts": TEXTS, "beam_size": 4, "num_return_sequences": 2})
    nbest = [[v.decode() for v in row] for row in result.as_numpy("translation")]
    assert nbest == [[h["translation"] for h in r["nbest"]] for r in native.json()["results"]]
    ids = [v.decode() for v in result.as_numpy("attention_id")]
    assert len(ids) == 2 and all(httpx.get(f"{server.url}/attention/{i}").status_code == 200 for i in ids)


def test_placeholders_come_back_over_grpc_as_over_the_native_route(server, client):
    texts = ["Deleted %d files in %s.", "Hello, {name}! You have {count} new messages."]
    result = client.infer("translator", [texts_input(texts)], parameters={"beam_size": 4})
    native = httpx.post(server.url + "/translate", json={"texts": texts, "beam_size": 4}).json()["results"]
    answered = [v.decode() for v in result.as_numpy("translation")]
    assert answered == [r["translation"] for r in native]
    assert all(
        sorted(s.text for s in find_spans(a)) == sorted(s.text for s in find_spans(t)) for a, t in zip(answered, texts)
    )


def test_stream_infer_answers_each_request_and_an_error_does_not_end_the_stream(client):
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("translator", [texts_input(TEXTS[:1])], request_id="a")
        client.async_stream_infer("translator", [images_input([b"not an image"])], request_id="bad")
        client.async_stream_infer("translator", [texts_input(TEXTS[1:])], request_id="b", parameters={"beam_size": 2})
        got = [answers.get(timeout=60) for _ in range(3)]
    finally:
        client.stop_stream()
    results = {r.get_response().id: r.as_numpy("translation")[0].decode() for r, e in got if e is None}
    errors = [e for _, e in got if e is not None]
    assert sorted(results) == ["a", "b"] and all(results.values())
    assert len(errors) == 1 and "takes exactly one input, text" in errors[0].message()


def test_the_aio_client(server):
    async def run() -> tuple:
        async with grpcaio.InferenceServerClient(server.grpc) as c:
            live, metadata = await c.is_server_live(), await c.get_model_metadata("translator", as_json=True)
            single = await c.infer("translator", [texts_input(TEXTS[:1])])

            async def requests():
                for i, text in enumerate(TEXTS):
                    yield {"model_name": "translator", "inputs": [texts_input([text])], "request_id": str(i)}

            streamed = {}
            async for result, error in c.stream_infer(requests()):
                assert error is None
                streamed[result.get_response().id] = result.as_numpy("translation")[0].decode()
                if len(streamed) == len(TEXTS):
                    break
            return live, metadata, single.as_numpy("translation")[0].decode(), streamed

    live, metadata, single, streamed = asyncio.run(run())
    native = httpx.post(server.url + "/translate", json={"texts": TEXTS}).json()["results"]
    assert live and metadata["name"] == "translator"
    assert single == native[0]["translation"]
    assert streamed == {"0": native[0]["translation"], "1": native[1]["translation"]}


@pytest.mark.parametrize(
    ("model", "tensor", "status", "message"),
    [
        ("nope", None, "NOT_FOUND", "is not loaded"),
        ("vit", "text", "INVALID_ARGUMENT", "takes exactly one input, images or pixels"),
        ("vit", "undecodable", "INVALID_ARGUMENT", "image"),
        ("translator", "too many", "INVALID_ARGUMENT", "at most"),
    ],
)
def test_errors_are_the_rest_ones_as_grpc_codes(server, client, model, tensor, status, message):
    if tensor == "text":
        inputs = [texts_input(TEXTS)]
    elif tensor == "too many":
        inputs = [texts_input(TEXTS * 20)]
    else:
        inputs = [images_input([b"not an image"])]
    with pytest.raises(InferenceServerException) as e:
        client.infer(model, inputs)
    assert code(e.value) == status and message in e.value.message()
    assert client.is_server_ready()  # the service goes on


@pytest.mark.parametrize(("images", "status", "message"), [(335, "RESOURCE_EXHAUSTED", "larger than max"), (320, "INVALID_ARGUMENT", "at most 8")])  # fmt: skip
def test_a_message_past_max_body_bytes_is_refused_as_rest_refuses_its_body(server, client, images, status, message):
    """The limit is ATTNSERVE_MAX_BODY_BYTES (1 MiB here), not gRPC's 4 MiB default: 335 images of
    28 x 28 FP32 (1.05 MB) are refused before they are read, 320 (1.0 MB) read and refused for their count."""
    pixels = np.zeros((images, 1, 28, 28), np.float32)
    tensor = grpcclient.InferInput("pixels", list(pixels.shape), "FP32")
    tensor.set_data_from_numpy(pixels)
    with pytest.raises(InferenceServerException) as e:
        client.infer("vit", [tensor])
    assert code(e.value) == status and message in e.value.message()
    rest = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    rest_tensor = httpclient.InferInput("pixels", list(pixels.shape), "FP32")
    rest_tensor.set_data_from_numpy(pixels, binary_data=True)
    with pytest.raises(InferenceServerException) as e:
        rest.infer("vit", [rest_tensor])
    assert e.value.status() == ("413" if status == "RESOURCE_EXHAUSTED" else "422")
    rest.close()
    assert client.is_server_ready()


def test_a_request_past_its_timeout_parameter_is_deadline_exceeded(server, client):
    with pytest.raises(InferenceServerException) as e:
        client.infer("translator", [texts_input(TEXTS)], timeout=1)  # 1 us: past it before decoding starts
    assert code(e.value) == "DEADLINE_EXCEEDED"
    metrics = httpx.get(server.url + "/metrics").text
    assert metric_value(metrics, "attnserve_deadline_exceeded_requests_total", route="grpc:ModelInfer") >= 1


def test_statistics_and_metrics_count_grpc_requests(server, client, pngs):
    (before,) = client.get_inference_statistics("vit", as_json=True)["model_stats"]
    client.infer("vit", [images_input(pngs[:2])])
    (after,) = client.get_inference_statistics("vit", "1", as_json=True)["model_stats"]
    assert int(after.get("inference_count", 0)) == int(before.get("inference_count", 0)) + 2
    metrics = httpx.get(server.url + "/metrics").text
    labels = {"route": "grpc:ModelInfer", "method": "GRPC", "status": "200"}
    assert metric_value(metrics, "attnserve_http_requests_total", **labels) >= 1


def test_unload_and_load_a_model(server, client):
    client.unload_model("translator")
    assert not client.is_model_ready("translator")
    with pytest.raises(InferenceServerException) as e:
        client.infer("translator", [texts_input(TEXTS[:1])])
    assert code(e.value) in ("NOT_FOUND", "UNAVAILABLE")
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {m["name"]: m.get("state") for m in index}["translator"] == "UNAVAILABLE"
    client.load_model("translator")
    assert client.is_model_ready("translator")
    assert client.infer("translator", [texts_input(TEXTS[:1])]).as_numpy("translation")[0]
    ready = client.get_model_repository_index(as_json=True)["models"]
    assert {(m["name"], m.get("state")) for m in ready} >= {("translator", "READY"), ("vit", "READY")}
