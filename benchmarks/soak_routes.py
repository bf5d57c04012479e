"""The request mix of :mod:`benchmarks.soak`, each answer judged against what the docs promise.

A route of the mix is one kind of request and the answer it must get. A route that needs a model
expects 200 while the model serves, 404 (``model_not_found``) while it is unloaded, and any of 200,
404 or 503 (``model_not_ready``) while its unload or load call runs; a request is judged by every
state the model passed through while it ran. Readiness stays 200 while a model is away (what is
loaded is ready); it may be 503 while a model loads or unloads.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import random
import re
import secrets
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc.aio as triton
from tritonclient.utils import InferenceServerException

from benchmarks.bench_classify import ROOT
from contract.manifest import latest_versions, read_manifest

WHILE = {"serving": {200}, "unloading": {200, 404, 503}, "unloaded": {404}, "loading": {200, 404, 503}}
READY_WHILE = {"serving": {200}, "unloading": {200, 503}, "unloaded": {200}, "loading": {200, 503}}
AWAY_CODES = {404: "model_not_found", 503: "model_not_ready"}  # the native error codes of a model away
GRPC_STATUS = {"NOT_FOUND": 404, "UNAVAILABLE": 503, "INVALID_ARGUMENT": 400, "INTERNAL": 500, "ABORTED": 409}
GRPC_CONNECTION = re.compile(r"connect|socket closed|reset by peer|broken pipe|stream removed|goaway", re.IGNORECASE)
ALIVE_MARGIN_S, EXPIRED_MARGIN_S = 5.0, 2.0  # an id is asked for well inside, or well past, its TTL


class ConnectionLost(Exception):
    """The transport failed: no answer came back (httpx's TransportError, or gRPC's own)."""


@dataclass(frozen=True)
class Answer:
    status: int
    problem: str | None = None  # a 200 whose body is not what the route promises, or an error of the wrong code
    attention_ids: tuple[str, ...] = ()
    detail: str = ""  # what an error answer said


@dataclass(frozen=True)
class Route:
    name: str
    call: Callable[[Soak, httpx.AsyncClient], Awaitable[Answer | None]]  # None: nothing to ask yet
    model: str | None = None  # the model it needs; "*" for readiness, which depends on all of them
    expect: frozenset[int] = frozenset({200})  # without a model


@dataclass
class ModelState:
    history: list[str] = field(default_factory=lambda: ["serving"])

    @property
    def state(self) -> str:
        return self.history[-1]

    def set(self, state: str) -> None:
        self.history.append(state)


@dataclass(frozen=True)
class Models:
    classifier: str
    translator: str


class Soak:
    """The clients, the attention ids answered so far, and every answer counted by route and kind."""

    def __init__(self, names: Models, repository: Path, rate: float, ttl_s: float) -> None:
        self.names, self.rate, self.ttl_s = names, rate, ttl_s
        self.models = {names.classifier: ModelState(), names.translator: ModelState()}
        entry = next(e for e in latest_versions(repository) if e.parent.name == names.classifier)
        self.images = [(entry / s["file"]).read_bytes() for s in read_manifest(entry)["samples"]]
        self.texts = (ROOT / "benchmarks" / "translate_sentences.txt").read_text().splitlines()
        self.ids: deque[tuple[float, float, str]] = deque()  # (request start, answer, id)
        self.counts: Counter[tuple[str, str, str]] = Counter()  # (route, status, kind)
        self.latencies: dict[str, list[float]] = {}
        self.samples: list[dict] = []
        self.cycles: list[dict] = []
        self.first_problems: list[str] = []
        self.started = time.monotonic()

    async def open(self, url: str, grpc_url: str) -> None:
        self.url = url
        self.grpc = triton.InferenceServerClient(grpc_url)  # one HTTP/2 connection for both gRPC routes

    def client(self) -> httpx.AsyncClient:
        """A client of its own for each route: one keep-alive connection, as many clients would hold."""
        return httpx.AsyncClient(base_url=self.url, timeout=60, limits=httpx.Limits(max_connections=1))

    async def close(self) -> None:
        await self.grpc.close()

    def image(self) -> bytes:
        return random.choice(self.images)

    def text(self) -> str:
        return random.choice(self.texts)

    # ---- attention ids --------------------------------------------------------------------------
    def alive_id(self) -> str | None:
        alive = [i for started, _, i in self.ids if started > time.monotonic() - self.ttl_s + ALIVE_MARGIN_S]
        return random.choice(alive) if alive else None

    def expired_id(self) -> str:
        """An id answered more than the TTL ago, or (before there is one) an id never given."""
        cutoff = time.monotonic() - self.ttl_s - EXPIRED_MARGIN_S
        expired = [i for _, answered, i in self.ids if answered < cutoff]
        return random.choice(expired) if expired else secrets.token_urlsafe(16)

    def ids_answered_since(self, t: float) -> int:
        return sum(answered > t for _, answered, _ in self.ids)

    def _keep_ids(self, started: float, answered: float, ids: tuple[str, ...]) -> None:
        self.ids.extend((started, answered, i) for i in ids)
        while self.ids and self.ids[0][1] < answered - self.ttl_s - 60:
            self.ids.popleft()

    # ---- calling and judging --------------------------------------------------------------------
    async def drive(self, route: Route, end_at: float) -> None:
        """Call ``route`` every 1/rate seconds, one request at a time, until ``end_at``."""
        interval = 1 / self.rate
        await asyncio.sleep(random.uniform(0, interval))  # the routes spread over the interval
        next_at = time.monotonic()
        async with self.client() as http:
            while time.monotonic() < end_at:
                await self.call(route, http)
                next_at = max(next_at + interval, time.monotonic())  # late: go on at once, no burst to catch up
                await asyncio.sleep(max(0.0, min(next_at, end_at) - time.monotonic()))

    async def call(self, route: Route, http: httpx.AsyncClient) -> Answer | None:
        marks = {name: len(m.history) - 1 for name, m in self.models.items()}
        started = time.monotonic()
        try:
            answer = await route.call(self, http)
        except (httpx.TransportError, ConnectionLost) as e:
            self._count(route.name, "-", "connection error", f"{route.name}: {e!r}")
            return None
        if answer is None:
            return None
        answered = time.monotonic()
        passed = {name: m.history[marks[name] :] for name, m in self.models.items()}
        if route.model == "*":
            allowed = set().union(*(READY_WHILE[s] for states in passed.values() for s in states))
        elif route.model is not None:
            allowed = set().union(*(WHILE[s] for s in passed[route.model]))
        else:
            allowed = set(route.expect)
        status = str(answer.status)
        if answer.status not in allowed:
            self._count(route.name, status, "unexpected", f"{route.name}: {status} {answer.problem or answer.detail}")
        elif answer.problem:
            self._count(route.name, status, "malformed", f"{route.name}: {status} {answer.problem}")
        elif answer.status == 200 or (route.model is None and answer.status in route.expect):
            self._count(route.name, status, "ok")
            self.latencies.setdefault(route.name, []).append(answered - started)
            self._keep_ids(started, answered, answer.attention_ids)
        else:
            self._count(route.name, status, "while a model was away")
        return answer

    def _count(self, route: str, status: str, kind: str, problem: str | None = None) -> None:
        self.counts[route, status, kind] += 1
        if problem and len(self.first_problems) < 20:
            self.first_problems.append(f"{time.monotonic() - self.started:.1f} s: {problem}"[:500])

    # ---- figures --------------------------------------------------------------------------------
    def _sum(self, *kinds: str) -> int:
        return sum(n for (_, _, kind), n in self.counts.items() if kind in kinds)

    def total(self) -> int:
        return sum(self.counts.values())

    def unexpected(self) -> int:
        """Answers of a status or a body the docs do not promise."""
        return self._sum("unexpected", "malformed")

    def connection_errors(self) -> int:
        return self._sum("connection error")

    def while_unloaded(self) -> int:
        return self._sum("while a model was away")

    def problems(self) -> list[tuple[int, str]]:
        return [
            (self._sum("unexpected"), "answers of an unexpected status"),
            (self._sum("malformed"), "answers whose body was not the documented one"),
            (self._sum("connection error"), "connection errors (no answer)"),
        ]

    def route_names(self) -> list[str]:
        """The routes of the mix in its order, then the repository calls."""
        order = {route.name: i for i, route in enumerate(routes(self))}
        return sorted(dict.fromkeys(route for route, _, _ in self.counts), key=lambda r: (order.get(r, len(order)), r))

    def counts_of(self, route: str) -> list[tuple[str, int]]:
        rows = sorted((status, kind, n) for (r, status, kind), n in self.counts.items() if r == route)
        return [(status if kind == "ok" else f"{status} {kind}".lstrip("- "), n) for status, kind, n in rows]

    def latency_text(self, route: str) -> str:
        seconds = sorted(self.latencies.get(route, []))
        if not seconds:
            return ""
        at = lambda q: seconds[min(len(seconds) - 1, int(q * len(seconds)))] * 1000
        return f"; {at(0.5):.0f}/{at(0.99):.0f}/{seconds[-1] * 1000:.0f} ms"

    def answers_json(self) -> dict[str, dict[str, int]]:
        return {route: dict(self.counts_of(route)) for route in self.route_names()}


# ---- the calls ------------------------------------------------------------------------------------
def native(r: httpx.Response, check: Callable[[dict], str | None] = lambda _: None) -> Answer:
    """A native route's answer: the body checked on 200, the error code checked otherwise."""
    if r.status_code != 200:
        code = r.json().get("error", {}).get("code") if "json" in r.headers.get("content-type", "") else None
        wrong = AWAY_CODES.get(r.status_code) not in (None, code)
        return Answer(r.status_code, f"error code {code!r}" if wrong else None, detail=r.text[:200])
    body = r.json()
    ids = tuple(x["attention_id"] for x in body.get("results", []) if x.get("attention_id"))
    return Answer(200, check(body), ids)


def has(condition: bool, what: str) -> str | None:
    return None if condition else what


async def classify(soak: Soak, http: httpx.AsyncClient) -> Answer:
    body = {"images": [base64.b64encode(soak.image()).decode()], "top_k": 3}
    r = await http.post("/classify", json=body)
    return native(r, lambda b: has(len(b["results"]) == 1 and len(b["results"][0]["top_k"]) == 3, "not 1 x top 3"))


async def classify_attention(soak: Soak, http: httpx.AsyncClient) -> Answer:
    files = {"file": ("image.png", soak.image(), "image/png")}
    r = await http.post("/classify", files=files, data={"return_attention": "true"})
    return native(r, lambda b: has(bool(b["results"][0].get("attention_id")), f"no attention id: {b}"))


def translate(attention: bool, beam: int) -> Callable[[Soak, httpx.AsyncClient], Awaitable[Answer]]:
    async def call(soak: Soak, http: httpx.AsyncClient) -> Answer:
        body = {"text": soak.text(), "beam_size": beam, "return_attention": attention}
        body |= {"num_return_sequences": 2} if beam > 1 else {}
        r = await http.post("/translate", json=body)
        return native(r, lambda b: check_translation(b["results"][0], attention, beam))

    return call


def check_translation(result: dict, attention: bool, beam: int) -> str | None:
    if not result["translation"].strip():
        return "empty translation"
    if beam > 1 and len(result.get("nbest", [])) != 2:
        return "no n-best list of 2"
    return has(bool(result.get("attention_id")) or not attention, f"no attention id: {result}")


async def translate_stream(soak: Soak, http: httpx.AsyncClient) -> Answer:
    async with http.stream("POST", "/translate", json={"text": soak.text(), "stream": True}) as r:
        text = (await r.aread()).decode()
        if r.status_code != 200:
            return native(httpx.Response(r.status_code, headers=r.headers, content=text.encode()))
    return Answer(200, has("event: token" in text and "event: done" in text, f"not a token stream: {text[:200]}"))


def attention(suffix: str, params: dict, check: Callable[[httpx.Response], bool]) -> Callable:
    async def call(soak: Soak, http: httpx.AsyncClient) -> Answer | None:
        key = soak.alive_id()
        if key is None:
            return None  # no attention answered yet
        r = await http.get(f"/attention/{key}{suffix}", params=params)
        return Answer(
            r.status_code, has(check(r), "not the maps") if r.status_code == 200 else None, detail=r.text[:200]
        )

    return call


async def attention_expired(soak: Soak, http: httpx.AsyncClient) -> Answer:
    r = await http.get(f"/attention/{soak.expired_id()}")
    code = r.json().get("error", {}).get("code")
    return Answer(r.status_code, has(code == "attention_not_found", f"error code {code!r}"))


async def oip_classify(soak: Soak, http: httpx.AsyncClient) -> Answer:
    body = {
        "inputs": [
            {"name": "images", "datatype": "BYTES", "shape": [1], "data": [base64.b64encode(soak.image()).decode()]}
        ],
        "outputs": [{"name": "probabilities", "parameters": {"classification": 3}}],
    }
    r = await http.post(f"/v2/models/{soak.names.classifier}/infer", json=body)
    if r.status_code != 200:
        return Answer(r.status_code, detail=r.text[:200])
    return Answer(200, has(r.json()["outputs"][0]["shape"] == [1, 3], f"not 1 x 3: {r.text[:200]}"))


async def oip_translate(soak: Soak, http: httpx.AsyncClient) -> Answer:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [soak.text()]}]}
    r = await http.post(f"/v2/models/{soak.names.translator}/infer", json=body)
    if r.status_code != 200:
        return Answer(r.status_code, detail=r.text[:200])
    data = {o["name"]: o["data"] for o in r.json()["outputs"]}
    return Answer(200, has(bool(data.get("translation", [""])[0]), f"no translation: {r.text[:200]}"))


async def grpc_infer(soak: Soak, model: str, tensor: str, value: bytes | str, output: str) -> Answer:
    inp = triton.InferInput(tensor, [1], "BYTES")
    inp.set_data_from_numpy(np.array([value], dtype=object))
    try:
        result = await soak.grpc.infer(model, [inp], client_timeout=60)
    except InferenceServerException as e:
        name = str(e.status()).removeprefix("StatusCode.")
        if name == "UNAVAILABLE" and GRPC_CONNECTION.search(e.message() or ""):
            raise ConnectionLost(e.message()) from e
        return Answer(GRPC_STATUS.get(name, 0), detail=f"{name}: {e.message()}")
    out = result.as_numpy(output)
    return Answer(200, has(out is not None and out.shape[0] == 1, f"no {output}"))


async def grpc_classify(soak: Soak, http: httpx.AsyncClient) -> Answer:
    return await grpc_infer(soak, soak.names.classifier, "images", soak.image(), "probabilities")


async def grpc_translate(soak: Soak, http: httpx.AsyncClient) -> Answer:
    return await grpc_infer(soak, soak.names.translator, "text", soak.text(), "translation")


def get(path: str, check: Callable[[httpx.Response], bool] = lambda r: True) -> Callable:
    async def call(soak: Soak, http: httpx.AsyncClient) -> Answer:
        r = await http.get(path)
        return Answer(
            r.status_code, has(check(r), "unexpected body") if r.status_code == 200 else None, detail=r.text[:200]
        )

    return call


def one_map(r: httpx.Response) -> bool:
    """Every map of the record, cut to layer 0 and head 0."""
    maps = r.json()["maps"].values()
    return bool(maps) and all(m["layers"] == [0] and m["heads"] == [0] and m["data"] for m in maps)


def routes(soak: Soak) -> list[Route]:
    vit, translator = soak.names.classifier, soak.names.translator
    is_png = lambda r: r.content.startswith(b"\x89PNG")
    return [
        Route("POST /classify", classify, vit),
        Route("POST /classify return_attention (multipart)", classify_attention, vit),
        Route("POST /translate greedy", translate(False, 1), translator),
        Route("POST /translate beam 4, 2 best", translate(False, 4), translator),
        Route("POST /translate greedy return_attention", translate(True, 1), translator),
        Route("POST /translate beam 4 return_attention", translate(True, 4), translator),
        Route("POST /translate stream", translate_stream, translator),
        Route("GET /attention/{id}?layer=0&head=0", attention("", {"layer": 0, "head": 0}, one_map)),
        Route("GET /attention/{id}.png", attention(".png", {}, is_png)),
        Route("GET /attention/{id}?format=npz", attention("", {"format": "npz"}, lambda r: r.content[:2] == b"PK")),
        Route("GET /attention/{id} past its TTL (or unknown)", attention_expired, expect=frozenset({404})),
        Route(f"POST /v2/models/{vit}/infer", oip_classify, vit),
        Route(f"POST /v2/models/{translator}/infer", oip_translate, translator),
        Route(f"gRPC ModelInfer {vit}", grpc_classify, vit),
        Route(f"gRPC ModelInfer {translator}", grpc_translate, translator),
        Route("GET /healthz", get("/healthz")),
        Route("GET /readyz", get("/readyz"), "*"),
        Route("GET /v2/health/ready", get("/v2/health/ready"), "*"),
        Route("GET /models", get("/models", lambda r: bool(r.json()["models"]))),
        Route("GET /metrics", get("/metrics", lambda r: "attnserve_http_requests_total" in r.text)),
    ]


async def unload_and_load(soak: Soak, every_s: float, unloaded_s: float, end_at: float) -> None:
    """Every ``every_s``, the classifier and the translator in turn: unload, wait ``unloaded_s``, load.
    No cycle starts that could not end (with a load of up to ``every_s``, at most 30 s) before ``end_at``."""
    names = [soak.names.classifier, soak.names.translator]
    for i in itertools.count():
        at = soak.started + (i + 1) * every_s
        if at + unloaded_s + min(every_s, 30.0) > end_at:
            return
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        name, model = names[i % 2], soak.models[names[i % 2]]
        async with soak.client() as http:  # an operator's client, for this cycle only
            model.set("unloading")
            await soak.call(repository_route(name, "unload"), http)
            model.set("unloaded")
            unloaded_at = time.monotonic()
            await asyncio.sleep(unloaded_s)
            model.set("loading")
            load_started = time.monotonic()
            await soak.call(repository_route(name, "load"), http)
            model.set("serving")
        soak.cycles.append(
            {
                "model": name,
                "unloaded_at_s": round(unloaded_at - soak.started, 1),
                "load_s": round(time.monotonic() - load_started, 2),
            }
        )


def repository_route(name: str, action: str) -> Route:
    async def call(soak: Soak, http: httpx.AsyncClient) -> Answer:
        r = await http.post(f"/v2/repository/models/{name}/{action}", timeout=300)
        return Answer(r.status_code, detail=r.text[:200])

    return Route(f"POST /v2/repository/models/{name}/{action}", call)
