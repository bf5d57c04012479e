"""Traces on real servers (``python -m service`` on the shipped models) exporting to a real OTLP receiver,
one over OTLP/HTTP, one over OTLP/gRPC (``tests/service/otlp_receiver.py``).

What an operator relies on: a request's trace continues the caller's ``traceparent`` and says where its time
went: its queue wait, the decoding hops (or the classification batch) it shared, linked to the other requests
in them, and the attention store; the trace id comes back in ``traceparent``. Without ``OTEL_*`` variables
nothing is exported and no ``traceparent`` is sent back.
"""

from __future__ import annotations

import base64
import os
import re
import threading
import time
from unittest import mock

import grpc
import httpx
import pytest

from benchmarks.otlp_receiver import Receiver, Span
from service.grpc.generated import grpc_service_pb2 as pb
from service.grpc.generated.grpc_service_pb2_grpc import GRPCInferenceServiceStub
from tests.conftest import ROOT
from tests.service.service_testing import free_port, start_subprocess_server

SHIPPED = ROOT / "models"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT}-01"
LONG = [  # with a beam of 4, long enough that a request sent once they decode joins them
    (
        "Save your changes before you close the window, or the changes you made to the document since you last "
        "saved it will be lost when the program quits."
    ),
    "The printer could not print the pages you selected because the paper tray is empty and the cover is open.",
    "If you remove this account, its messages, contacts and calendars are removed from this computer as well.",
]


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def servers(receiver, tmp_path_factory):
    """``http``: OTLP over HTTP (the default protocol), one decoding lane whose first decoder run after start takes
    half a second longer (so that a second request surely joins the first one's batch); ``grpc``: OTLP over gRPC,
    serving gRPC itself; ``off``: no OTEL_* variables."""
    folder = tmp_path_factory.mktemp("tracing")
    common = {"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SERVICE_NAME": "attnserve-test"}
    variants = {
        "http": (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint},
            {"decoding_lanes": "1", "faults": "decoder:stall=0.5"},
        ),
        "grpc": (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            {"grpc_port": str(free_port())},
        ),
        "off": ({}, {}),
    }
    started = {}
    try:
        for name, (env, settings) in variants.items():
            clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
            with mock.patch.dict(os.environ, {**clean, **(common if env else {}), **env}, clear=True):
                started[name] = start_subprocess_server(folder, SHIPPED, **settings)
        for srv in started.values():
            srv.wait_ready()
        yield started
    finally:
        for srv in started.values():
            srv.stop()


def of_trace(spans: list[Span], trace_id: str) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for s in spans:
        if s.trace_id == trace_id:
            out.setdefault(s.name, []).append(s)
    return out


def test_a_translation_continues_the_callers_trace_and_shows_its_queue_and_the_hops_it_shared(servers, receiver):
    url = servers["http"].url
    other_trace = "5cf92f3577b34da6a3ce929d0e0e4737"
    first: dict[str, httpx.Response] = {}
    body = {"texts": ["Open the file.", *LONG], "return_attention": True, "beam_size": 4}

    def send() -> None:
        first["r"] = httpx.post(f"{url}/translate", json=body, headers={"traceparent": TRACEPARENT}, timeout=60)

    thread = threading.Thread(target=send)
    thread.start()
    while not re.search(
        r"^attnserve_(running|waiting)_sequences\{[^}]*\} [1-9]", httpx.get(f"{url}/metrics").text, re.MULTILINE
    ):
        assert thread.is_alive(), "the first request was answered before it was seen decoding"
        time.sleep(0.002)
    second = httpx.post(
        f"{url}/translate",
        json={"text": "The printer is out of paper."},
        headers={"traceparent": f"00-{other_trace}-{PARENT}-01"},
    )
    thread.join()
    answers = [first["r"], second]
    assert all(r.status_code == 200 for r in answers)
    back = answers[0].headers["traceparent"]
    assert back.startswith(f"00-{TRACE_ID}-") and not back.startswith(f"00-{TRACE_ID}-{PARENT}")

    def complete(spans: list[Span]) -> bool:
        mine = of_trace(spans, TRACE_ID)
        return (
            len(mine.get("decode", [])) == len(body["texts"])
            and "POST /translate" in mine
            and bool(of_trace(spans, other_trace))
        )

    spans = receiver.wait_for(complete)
    mine = of_trace(spans, TRACE_ID)
    (server,) = mine["POST /translate"]
    assert server.parent == PARENT and server.span_id == back.split("-")[2] and server.service == "attnserve-test"
    assert server.attributes["http.response.status_code"] == 200 and server.attributes["http.route"] == "/translate"
    assert len(mine["queue"]) == len(body["texts"]) and all(
        s.parent == server.span_id for s in mine["queue"] + mine["decode"]
    )
    assert [s.parent for s in mine["attention store"]] == [server.span_id] * len(body["texts"])  # a record per text
    hops = {(s.trace_id, s.span_id): s for s in spans if s.name == "decode hop"}
    for decode in mine["decode"]:
        assert decode.links and all(link in hops for link in decode.links)
        assert decode.attributes["attnserve.hops"] == len(decode.links)
        assert all((TRACE_ID, server.span_id) in hops[link].links for link in decode.links)  # and back
        assert decode.start_ns >= server.start_ns and decode.end_ns <= server.end_ns
    shared = [h for h in hops.values() if {t for t, _ in h.links} == {TRACE_ID, other_trace}]
    assert shared, (
        "the two requests never stepped in one hop",
        [sorted({t for t, _ in h.links}) for h in hops.values()],
    )
    assert all(h.attributes["attnserve.rows"] >= 2 and h.attributes["attnserve.steps"] >= 1 for h in shared)


def test_a_classification_links_its_batch(servers, receiver, fashion_pngs):
    trace_id = "6df92f3577b34da6a3ce929d0e0e4738"
    body = {"images": [base64.b64encode(p).decode() for p in fashion_pngs[:2]]}
    r = httpx.post(
        f"{servers['http'].url}/classify", json=body, headers={"traceparent": f"00-{trace_id}-{PARENT}-01"}, timeout=60
    )
    assert r.status_code == 200
    spans = receiver.wait_for(lambda spans: "classify" in of_trace(spans, trace_id))
    mine = of_trace(spans, trace_id)
    (batch_link,) = mine["classify"][0].links
    (batch,) = [s for s in spans if (s.trace_id, s.span_id) == batch_link]
    assert batch.name == "classify batch" and batch.attributes["attnserve.rows"] >= 2
    assert (trace_id, mine["POST /classify"][0].span_id) in batch.links


def test_grpc_calls_continue_the_trace_and_otlp_goes_over_grpc(servers, receiver):
    trace_id = "7ef92f3577b34da6a3ce929d0e0e4739"
    request = pb.ModelInferRequest(
        model_name="translator",
        inputs=[
            pb.ModelInferRequest.InferInputTensor(
                name="text", datatype="BYTES", shape=[1], contents=pb.InferTensorContents(bytes_contents=[b"Hello."])
            )
        ],
    )
    with grpc.insecure_channel(servers["grpc"].grpc) as channel:
        _, call = GRPCInferenceServiceStub(channel).ModelInfer.with_call(
            request, metadata=(("traceparent", f"00-{trace_id}-{PARENT}-01"),), timeout=60
        )
    back = dict(call.trailing_metadata())["traceparent"]
    spans = receiver.wait_for(lambda spans: "decode" in of_trace(spans, trace_id))
    mine = of_trace(spans, trace_id)
    (server,) = mine["inference.GRPCInferenceService/ModelInfer"]
    assert server.parent == PARENT and back == f"00-{trace_id}-{server.span_id}-01"
    assert mine["decode"][0].parent == server.span_id
    assert receiver.exports["grpc"] >= 1 and receiver.exports["http"] >= 1


def test_without_otel_variables_nothing_is_traced(servers, receiver):
    trace_id = "8ff92f3577b34da6a3ce929d0e0e4730"
    r = httpx.post(
        f"{servers['off'].url}/translate",
        json={"text": "Hello."},
        headers={"traceparent": f"00-{trace_id}-{PARENT}-01"},
        timeout=60,
    )
    assert r.status_code == 200 and "traceparent" not in r.headers
    httpx.post(f"{servers['http'].url}/translate", json={"text": "Hello."}, timeout=60)  # a traced one, after it
    receiver.wait_for(lambda spans: len([s for s in spans if s.name == "POST /translate"]) >= 2)
    assert not of_trace(receiver.spans, trace_id)
