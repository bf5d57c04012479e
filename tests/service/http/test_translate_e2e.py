"""``POST /translate`` end to end on a real uvicorn server serving the tiny translator (and the tiny ViT).

What a user relies on: the service gives what offline ORT decoding gives, results never depend on
what else is in the batch, streaming ends where the plain answer ends, a client that leaves frees
its rows, and every bad input gets its status and JSON error.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import onnxruntime as ort
import pytest

from contract.decoding import DecoderSpec, greedy, session_fn
from contract.manifest import load_entry
from contract.tokenizer import Tokenizer
from tests.service.service_testing import BASE_ENV, metric_value, serving, wait_until

TEXTS = [
    "Open the dialog.",
    "I've made one or two modifications to the original design.",
    "Select the cells you want to format and choose Format - Cells.",
    "Yes.",
    "They come in all shapes and sizes, and some of them are very long indeed, longer than the others.",
    "Saves the current document.",
]


@pytest.fixture(scope="module")
def repository(both_repository):
    return both_repository


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    with serving(tmp_path_factory.mktemp("translate"), repository, max_text_chars=300) as srv:
        yield srv


@pytest.fixture(scope="module")
def offline(repository):
    """Greedy decoding straight on onnxruntime sessions of the same entry: the reference."""
    entry = repository / "translator" / "1"
    spec = DecoderSpec.from_manifest(load_entry(entry).manifest)
    enc, dec = (
        session_fn(ort.InferenceSession(str(entry / f), providers=["CPUExecutionProvider"]))
        for f in ("encoder.onnx", "decoder.onnx")
    )
    tok = Tokenizer.load(entry / "tokenizer.model")

    def translate(text: str) -> str:
        (h,) = greedy(enc, dec, [tok.encode(text, add_eos=True)], spec)
        return tok.decode(h.tokens)

    return translate


def post(srv, **body) -> httpx.Response:
    return httpx.post(srv.url + "/translate", json=body, timeout=60)


def test_translations_equal_offline_onnxruntime_greedy_decoding(server, offline):
    r = post(server, texts=TEXTS, beam_size=1)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "translator" and body["version"] == "1"
    assert [res["translation"] for res in body["results"]] == [offline(t) for t in TEXTS]
    first = body["results"][0]
    assert first["source_tokens"][-1] == "</s>" and isinstance(first["target_tokens"], list)
    assert post(server, text=TEXTS[1], beam_size=1).json()["results"][0] == body["results"][1]


def test_a_request_without_options_decodes_with_the_manifests_defaults(server):
    (model,) = [m for m in httpx.get(server.url + "/models").json()["models"] if m["name"] == "translator"]
    beam, penalty = model["decoding"]["default_beam_size"], model["decoding"]["default_length_penalty"]
    assert beam > 1  # a 2-best list needs a beam: greedy decoding would refuse it
    default = post(server, texts=TEXTS, num_return_sequences=2)
    assert default.status_code == 200, default.text
    explicit = post(server, texts=TEXTS, num_return_sequences=2, beam_size=beam, length_penalty=penalty)
    assert default.json() == explicit.json()
    assert post(server, texts=TEXTS, num_return_sequences=2, beam_size=1).status_code == 422


def test_the_operator_sets_the_default_beam(repository, tmp_path_factory):
    with serving(tmp_path_factory.mktemp("greedy-default"), repository, default_beam_size=1) as srv:
        (model,) = [m for m in httpx.get(srv.url + "/models").json()["models"] if m["name"] == "translator"]
        assert model["decoding"]["default_beam_size"] == 1
        assert post(srv, texts=TEXTS).json() == post(srv, texts=TEXTS, beam_size=1).json()
        assert post(srv, texts=TEXTS, num_return_sequences=2).status_code == 422  # greedy: no 2-best list
        assert post(srv, texts=TEXTS, num_return_sequences=2, beam_size=2).status_code == 200


def test_nbest_is_sorted_and_its_first_is_the_single_best(server):
    single = post(server, text=TEXTS[2], beam_size=4).json()["results"][0]
    many = post(server, text=TEXTS[2], beam_size=4, num_return_sequences=3).json()["results"][0]
    assert "nbest" not in single and len(many["nbest"]) == 3
    ranks = [h["normalized_score"] for h in many["nbest"]]
    assert ranks == sorted(ranks, reverse=True)
    assert many["nbest"][0]["translation"] == single["translation"] == many["translation"]


def test_results_do_not_depend_on_what_else_is_in_the_batch(server):
    cases = [
        {"text": TEXTS[i % len(TEXTS)] * (1 + i % 3), "beam_size": 1 + (i % 4 == 1) * 3 + (i % 4 == 3)}
        for i in range(24)
    ]
    alone = [post(server, **c).json() for c in cases]
    with ThreadPoolExecutor(24) as pool:
        together = list(pool.map(lambda c: post(server, **c).json(), cases))
    assert together == alone
    assert {c["beam_size"] for c in cases} == {1, 2, 4}


def test_the_stream_ends_with_the_plain_answer(server):
    plain = post(server, text=TEXTS[4], beam_size=1).json()  # a stream without beam_size decodes greedily
    events = []
    with httpx.stream("POST", server.url + "/translate", json={"text": TEXTS[4], "stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                events.append((event, json.loads(line[6:])))
    tokens = [data for kind, data in events if kind == "token"]
    assert events[-1] == ("done", plain)
    assert len(tokens) == len(plain["results"][0]["target_tokens"])
    assert [t["token"] for t in tokens] == plain["results"][0]["target_tokens"]
    assert tokens[-1]["text"] == plain["results"][0]["translation"]


def test_models_lists_the_translator_with_its_scheduler(server):
    models = {m["name"]: m for m in httpx.get(server.url + "/models").json()["models"]}
    t = models["translator"]
    assert t["task"] == "translation" and t["status"] == "ready" and t["default"] and models["vit"]["default"]
    assert t["languages"] == {"source": "en", "target": "de"} and "bleu" in t["evaluation"]["greedy"]
    assert t["scheduler"]["running_sequences"] == 0 and t["scheduler"]["max_running_rows"] >= 8


BAD = {
    "empty text": ({"text": ""}, 422, "invalid_field"),
    "whitespace": ({"texts": ["fine", " \n\t "]}, 422, "invalid_field"),
    "both": ({"text": "a", "texts": ["b"]}, 422, "invalid_field"),
    "neither": ({"beam_size": 2}, 422, "invalid_field"),
    "empty list": ({"texts": []}, 422, "invalid_field"),
    "not a string": ({"text": 5}, 422, "invalid_field"),
    "too many texts": ({"texts": ["a"] * 33}, 422, "invalid_field"),
    "too long": ({"text": "word " * 100}, 413, "text_too_long"),
    "beam too large": ({"text": "a", "beam_size": 9}, 422, "invalid_field"),
    "beam zero": ({"text": "a", "beam_size": 0}, 422, "invalid_field"),
    "n-best over beam": ({"text": "a", "beam_size": 2, "num_return_sequences": 3}, 422, "invalid_field"),
    "max_new_tokens": ({"text": "a", "max_new_tokens": 100_000}, 422, "invalid_field"),
    "length penalty": ({"text": "a", "length_penalty": -1}, 422, "invalid_field"),
    "attention not a bool": ({"text": "a", "return_attention": "yes"}, 422, "invalid_field"),
    "stream two": ({"texts": ["a", "b"], "stream": True}, 422, "invalid_field"),
    "unknown field": ({"text": "a", "temperature": 0.7}, 422, "invalid_field"),
    "unknown priority": ({"text": "a", "priority": "urgent"}, 422, "invalid_field"),
    "unknown model": ({"text": "a", "model": "nope"}, 404, "model_not_found"),
    "a classifier": ({"text": "a", "model": "vit"}, 404, "model_not_found"),
}


@pytest.mark.parametrize("body, status, code", BAD.values(), ids=BAD.keys())
def test_bad_input_gets_its_status_and_a_json_error(server, body, status, code):
    r = post(server, **body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["message"]


def test_batch_priority_translates_the_same_and_is_counted_apart(server):
    """A `batch` request gets the answer an interactive one gets; its sentences' queue wait is counted under its
    priority (over HTTP, and as the Open Inference Protocol's parameter)."""

    def waits(priority: str) -> float:
        text = httpx.get(server.url + "/metrics", timeout=10).text
        return metric_value(text, "attnserve_priority_queue_wait_seconds_count", model="translator", priority=priority)

    before = {p: waits(p) for p in ("interactive", "batch")}
    interactive = post(server, texts=TEXTS[:2], beam_size=1)
    batch = post(server, texts=TEXTS[:2], beam_size=1, priority="batch")
    assert interactive.status_code == batch.status_code == 200, batch.text
    assert batch.json()["results"] == interactive.json()["results"]
    assert waits("batch") - before["batch"] == 2 and waits("interactive") - before["interactive"] == 2
    oip = {
        "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [TEXTS[0]]}],
        "parameters": {"beam_size": 1, "priority": "batch"},
    }
    r = httpx.post(server.url + "/v2/models/translator/infer", json=oip, timeout=60)
    assert r.status_code == 200, r.text
    assert waits("batch") - before["batch"] == 3


def test_bad_bodies(server):
    r = httpx.post(server.url + "/translate", content=b"{nope", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(server.url + "/translate", content=b"text=hi", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    assert post(server, text=TEXTS[0]).status_code == 200  # and the service still serves


@pytest.fixture
def slow_server(repository, monkeypatch):
    """An in-process server whose decoder steps take >= 20 ms (the real step, behind a delay)."""
    from service.engine import scheduler
    from service.process import create_app
    from service.settings import Settings
    from tests.service.service_testing import ThreadServer

    real = scheduler.step

    def slow_step(batch, decoder, spec):
        time.sleep(0.02)
        return real(batch, decoder, spec)

    def make(**overrides):
        base = {k.removeprefix("ATTNSERVE_").lower(): v for k, v in BASE_ENV.items()}
        return ThreadServer(create_app(Settings(**{"model_repository": repository, **base, **overrides})))

    monkeypatch.setattr(scheduler, "step", slow_step)
    return make


def test_a_client_that_disconnects_mid_stream_frees_its_rows(slow_server):
    with slow_server() as srv:
        srv.wait_ready()
        body = {"text": TEXTS[4], "stream": True, "max_new_tokens": 200}
        with httpx.stream("POST", srv.url + "/translate", json=body, timeout=60) as r:
            lines = r.iter_lines()  # held: dropping the iterator would close the connection
            next(line for line in lines if line.startswith("event: token"))
            running = httpx.get(srv.url + "/models").json()["models"]
            assert next(m for m in running if m["name"] == "translator")["scheduler"]["running_sequences"] == 1, running
        # the connection is closed: the request leaves at the next step, long before its 200 tokens

        def freed() -> bool:
            m = next(m for m in httpx.get(srv.url + "/models").json()["models"] if m["name"] == "translator")
            return m["scheduler"]["running_sequences"] == 0

        wait_until(freed, timeout=3.0, what="the cancelled stream to leave the batch")
        assert (
            metric_value(httpx.get(srv.url + "/metrics").text, "attnserve_dropped_requests_total", model="translator")
            == 1
        )


def test_a_full_queue_answers_503_with_retry_after(slow_server):
    with slow_server(max_running_sequences=1, max_waiting_sequences=2, max_texts_per_request=1, max_beam_size=1) as srv:
        srv.wait_ready()
        barrier = threading.Barrier(8)

        def send(_):
            barrier.wait()
            return post(srv, text=TEXTS[4], max_new_tokens=30)

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(send, range(8)))
        statuses = sorted(a.status_code for a in answers)
        assert statuses.count(200) >= 3 and 503 in statuses
        refused = next(a for a in answers if a.status_code == 503)
        assert refused.json()["error"]["code"] == "overloaded" and refused.headers["retry-after"] == "1"
        assert post(srv, text=TEXTS[0]).status_code == 200
