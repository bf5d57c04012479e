"""Under more load than it can take, the service answers every request it receives, refusals included.

Starts ``python -m service`` (the tiny ViT and translator, real onnxruntime sessions, real uvicorn)
on a free 127.0.0.1 port with small queues and a small bound on requests in flight, and drives it
from this process with closed-loop ``httpx.AsyncClient`` clients, each on its own keep-alive
connection: ``POST /classify`` (real Fashion-MNIST images), ``POST /translate`` and the Open
Inference Protocol's ``POST /v2/models/translator/infer``. One more client stays idle on its
connection between two requests for longer than uvicorn's own keep-alive default (5 s), as a client
whose event loop lags behind its answers does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections import Counter

import httpx
import pytest

from tests.service.service_testing import serving

LOAD_S = 8.0
UVICORN_KEEP_ALIVE_S = 5  # uvicorn's default, which closed connections under clients that lagged behind
LIMITS = {
    "max_requests_in_flight": 24,
    "max_queue_images": 16,
    "max_texts_per_request": 4,
    "max_beam_size": 4,
    "max_waiting_sequences": 16,
}
CLIENTS = {"/classify": 48, "/translate": 32, "/v2/models/translator/infer": 16}  # closed-loop clients by route
TEXTS = ["A small cat sat on the warm mat.", "Open the file and save it.", "The weather was stable on Sunday."]


@pytest.fixture(scope="module")
def server(both_repository, tmp_path_factory):
    with serving(tmp_path_factory.mktemp("overload"), both_repository, **LIMITS) as srv:
        yield srv


def bodies(fashion_pngs: list[bytes]) -> dict[str, list[bytes]]:
    images = [base64.b64encode(p).decode() for p in fashion_pngs]
    oip = [{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [t]}]} for t in TEXTS]
    return {
        "/classify": [json.dumps({"images": images[i : i + 1 + i % 4]}).encode() for i in range(32)],
        "/translate": [json.dumps({"text": t}).encode() for t in TEXTS],
        "/v2/models/translator/infer": [json.dumps(b).encode() for b in oip],
    }


async def closed_loop(url: str, path: str, payloads: list[bytes], until: float, seen: Counter, refusals: list) -> None:
    headers = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=url, timeout=60.0, verify=False) as client:
        i = 0
        while time.monotonic() < until:
            i += 1
            try:
                r = await client.post(path, content=payloads[i % len(payloads)], headers=headers)
            except httpx.TransportError as e:  # the connection ended without an answer
                seen[f"{path} {type(e).__name__}"] += 1
                continue
            seen[f"{path} {r.status_code}"] += 1
            if r.status_code == 503:
                refusals.append((path, r.headers.get("retry-after"), r.headers.get("content-type"), r.content))


async def idle_between_requests(url: str, payload: bytes) -> list[tuple[int, tuple]]:
    """Two requests on one connection, idle longer than uvicorn's default keep-alive in between
    (httpx itself would keep the connection for 60 s); each answer's status and local address."""
    limits = httpx.Limits(keepalive_expiry=60.0)
    async with httpx.AsyncClient(base_url=url, timeout=60.0, verify=False, limits=limits) as client:
        out = []
        for pause in (0.0, UVICORN_KEEP_ALIVE_S + 1.5):
            await asyncio.sleep(pause)
            r = await client.post("/translate", content=payload, headers={"Content-Type": "application/json"})
            out.append((r.status_code, r.extensions["network_stream"].get_extra_info("client_addr")))
        return out


async def overload(url: str, payloads: dict[str, list[bytes]]) -> tuple[Counter, list, list]:
    seen: Counter = Counter()
    refusals: list = []
    until = time.monotonic() + LOAD_S
    loops = [
        closed_loop(url, path, payloads[path], until, seen, refusals) for path, n in CLIENTS.items() for _ in range(n)
    ]
    idle = idle_between_requests(url, payloads["/translate"][0])
    *_, reused = await asyncio.gather(*loops, idle)
    return seen, refusals, reused


def test_every_request_is_answered_and_every_refusal_is_a_503_with_retry_after(server, fashion_pngs):
    seen, refusals, reused = asyncio.run(overload(server.url, bodies(fashion_pngs)))

    dropped = {k: n for k, n in seen.items() if not k.rsplit(" ", 1)[1].isdigit()}
    assert dropped == {}, f"connections closed without an answer: {dropped} (of {dict(seen)})"
    assert set(seen) <= {f"{path} {status}" for path in CLIENTS for status in (200, 503)}, dict(seen)
    assert refusals, f"the load never exceeded the bounds: {dict(seen)}"
    codes, messages = Counter(), Counter()
    for path, retry_after, content_type, body in refusals:
        assert retry_after == "1" and content_type == "application/json", (path, retry_after, content_type)
        error = json.loads(body)["error"]
        if path.startswith("/v2/"):  # the protocol's error body: a message only
            assert isinstance(error, str), body
            messages[error.split(" (")[0]] += 1
        else:
            codes[error["code"]] += 1
            messages[error["message"].split(" (")[0]] += 1
    assert set(codes) == {"overloaded"}, codes
    in_flight = f"the service has {LIMITS['max_requests_in_flight']} requests in flight"
    assert in_flight in messages, messages  # refused at once, before their bodies were read
    [(first, here), (second, there)] = reused
    # the same connection, still open (the load runs meanwhile, so either request may be refused)
    assert {first, second} <= {200, 503} and here == there, reused
