"""gRPC and HTTP in one process on one set of queues: keys, a full queue, the in-flight bound, batches that
mix the two, and the gRPC deadline. uvicorn serves a fresh app in a thread of the test process (HTTP and gRPC on free
ports of 127.0.0.1), on the tiny ViT, with ``Classifier.run`` gated so a batch can be held in flight."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from service.core.keys import hash_key
from service.grpc.generated import grpc_service_pb2 as pb
from service.grpc.generated.grpc_service_pb2_grpc import GRPCInferenceServiceStub
from tests.service.service_testing import free_port, metric_value, wait_until
from tests.service.test_serving_states import GatedRun

KEY = "grpc-test-key"


@pytest.fixture
def gated_run(monkeypatch):
    gate = GatedRun(monkeypatch)
    yield gate
    gate.open.set()


def images_input(pngs: list[bytes]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("images", [len(pngs)], "BYTES")
    tensor.set_data_from_numpy(np.array(pngs, dtype=object))
    return tensor


def queued_images(srv) -> float:
    return metric_value(httpx.get(srv.url + "/metrics").text, "attnserve_queue_images", model="vit")


def test_every_call_but_liveness_and_readiness_needs_the_key(thread_server, fashion_pngs):
    port = free_port()
    with thread_server(grpc_port=port, api_key_hashes=(hash_key(KEY),)) as srv:
        srv.wait_ready = lambda: None  # /readyz needs no key; the model readiness below does
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        wait_until(client.is_server_ready, what="the gRPC server ready")
        assert client.is_server_live()
        with pytest.raises(InferenceServerException) as e:
            client.infer("vit", [images_input(fashion_pngs[:1])])
        assert e.value.status() == "StatusCode.UNAUTHENTICATED" and "API key" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            client.get_model_metadata("vit", headers={"authorization": "Bearer wrong"})
        assert e.value.status() == "StatusCode.UNAUTHENTICATED" and "not accepted" in e.value.message()
        keyed = {"authorization": f"Bearer {KEY}"}
        assert client.infer("vit", [images_input(fashion_pngs[:1])], headers=keyed).as_numpy("probabilities").shape == (1, 10)  # fmt: skip
        client.close()


def test_a_full_queue_answers_unavailable_as_triton_does(thread_server, gated_run, fashion_pngs):
    port = free_port()
    settings = {"max_batch_size": 2, "max_images_per_request": 2, "max_queue_images": 2, "model_instances": 1}
    with thread_server(grpc_port=port, **settings) as srv, ThreadPoolExecutor(2) as pool:
        srv.wait_ready()
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        gated_run.hold()
        running = pool.submit(client.infer, "vit", [images_input(fashion_pngs[:1])])
        assert gated_run.entered.wait(timeout=60)
        queued = pool.submit(client.infer, "vit", [images_input(fashion_pngs[1:3])])
        wait_until(lambda: queued_images(srv) == 2, what="two images queued")
        with pytest.raises(InferenceServerException) as e:
            client.infer("vit", [images_input(fashion_pngs[3:4])])
        gated_run.open.set()
        assert running.result().as_numpy("probabilities").shape == (1, 10)
        assert queued.result().as_numpy("probabilities").shape == (2, 10)
        client.close()
    assert e.value.status() == "StatusCode.UNAVAILABLE" and "queue" in e.value.message()


def test_grpc_and_http_requests_are_batched_together(thread_server, gated_run, fashion_pngs):
    """While a batch is held in flight, two gRPC and two HTTP requests queue; the next batch takes all four."""
    port = free_port()
    settings = {"max_batch_size": 8, "max_images_per_request": 2, "model_instances": 1}
    with thread_server(grpc_port=port, **settings) as srv, ThreadPoolExecutor(5) as pool:
        srv.wait_ready()
        warm_up = len(gated_run.sizes)  # the batches run at load
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        gated_run.hold()
        first = pool.submit(client.infer, "vit", [images_input(fashion_pngs[:1])])
        assert gated_run.entered.wait(timeout=60)
        grpc_calls = [pool.submit(client.infer, "vit", [images_input(fashion_pngs[i : i + 1])]) for i in (1, 2)]
        body = {"images": [base64.b64encode(p).decode() for p in fashion_pngs[3:4]]}
        http_calls = [pool.submit(httpx.post, srv.url + "/classify", json=body, timeout=60) for _ in range(2)]
        wait_until(lambda: queued_images(srv) == 4, what="two gRPC and two HTTP images queued")
        gated_run.open.set()
        assert first.result() and all(c.result().as_numpy("probabilities").shape == (1, 10) for c in grpc_calls)
        assert all(c.result().status_code == 200 for c in http_calls)
        metrics = httpx.get(srv.url + "/metrics").text
        client.close()
    assert gated_run.sizes[warm_up:] == [1, 4]  # one batch holds all four: neither transport alone sent more than two
    batches_of = {le: metric_value(metrics, "attnserve_batch_size_bucket", model="vit", le=le) for le in ("2.0", "4.0")}  # fmt: skip
    assert batches_of["4.0"] - batches_of["2.0"] == 1  # the histogram shows the mixed batch of 4


def test_the_grpc_deadline_is_the_requests(thread_server, gated_run, fashion_pngs):
    """A call whose gRPC deadline passes while its batch waits is answered DEADLINE_EXCEEDED and never computed."""
    port = free_port()
    with thread_server(grpc_port=port, model_instances=1) as srv, ThreadPoolExecutor(1) as pool:
        srv.wait_ready()
        warm_up = len(gated_run.sizes)  # the batches run at load
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        gated_run.hold()
        held = pool.submit(client.infer, "vit", [images_input(fashion_pngs[:1])])
        assert gated_run.entered.wait(timeout=60)
        with pytest.raises(InferenceServerException) as e:
            client.infer("vit", [images_input(fashion_pngs[1:3])], client_timeout=0.5)
        gated_run.open.set()
        assert held.result().as_numpy("probabilities").shape == (1, 10)
        wait_until(lambda: queued_images(srv) == 0, what="the queue empty")
        client.close()
    assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert gated_run.sizes[warm_up:] == [1]  # the late request left the queue before compute


def infer_request(png: bytes) -> pb.ModelInferRequest:
    contents = pb.InferTensorContents(bytes_contents=[png])
    return pb.ModelInferRequest(
        model_name="vit",
        inputs=[pb.ModelInferRequest.InferInputTensor(name="images", datatype="BYTES", shape=[1], contents=contents)],
    )


def test_the_in_flight_bound_refuses_grpc_unavailable_as_it_refuses_http_503(thread_server, gated_run, fashion_pngs):
    """One bound for both transports: with a gRPC call computing (held) and an HTTP request queued behind it,
    the bound of two is reached; a gRPC call (grpcio, to read the trailing metadata) is refused UNAVAILABLE
    with ``retry-after``, a request of a stream gets the same message as its error, an HTTP request 503 with
    ``Retry-After``; once the two are answered, both transports are admitted again."""
    port = free_port()
    settings = {"max_requests_in_flight": 2, "model_instances": 1, "retry_after_s": 3}
    body = {"images": [base64.b64encode(p).decode() for p in fashion_pngs[1:3]]}  # two: the queue gauge tells
    with thread_server(grpc_port=port, **settings) as srv, ThreadPoolExecutor(2) as pool:
        srv.wait_ready()
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        gated_run.hold()
        held = pool.submit(client.infer, "vit", [images_input(fashion_pngs[:1])])
        assert gated_run.entered.wait(timeout=60)
        queued = pool.submit(httpx.post, srv.url + "/classify", json=body, timeout=60)
        wait_until(lambda: queued_images(srv) == 2, what="the HTTP request queued behind the gRPC call")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(infer_request(fashion_pngs[2]), timeout=30)
            (streamed,) = list(stub.ModelStreamInfer(iter([infer_request(fashion_pngs[2])]), timeout=30))
        refused_http = httpx.post(srv.url + "/classify", json=body, timeout=30)
        gated_run.open.set()
        assert held.result().as_numpy("probabilities").shape == (1, 10)
        assert queued.result().status_code == 200
        assert client.infer("vit", [images_input(fashion_pngs[3:4])]).as_numpy("probabilities").shape == (1, 10)
        assert httpx.post(srv.url + "/classify", json=body, timeout=30).status_code == 200
        metrics = httpx.get(srv.url + "/metrics").text
        client.close()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "2 requests in flight (bound 2)" in refused.value.details()
    assert ("retry-after", "3") in refused.value.trailing_metadata()
    assert "2 requests in flight (bound 2)" in streamed.error_message
    assert refused_http.status_code == 503 and refused_http.headers["retry-after"] == "3"
    assert refused_http.json()["error"]["code"] == "overloaded"
    assert metric_value(metrics, "attnserve_grpc_calls_total", method="ModelInfer", code="UNAVAILABLE") == 1
    assert metric_value(metrics, "attnserve_grpc_calls_total", method="ModelStreamInfer", code="UNAVAILABLE") == 1
