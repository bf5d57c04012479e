"""Several replicas behind HAProxy, run for real: the Compose profile ``scale`` on a private dockerd.

Starts Debian's dockerd with the stand-in bases and a stand-in of ``haproxy`` made of Debian's haproxy
2.6 (tests/deploy/docker_engine.py), builds the ``cpu`` image, and brings up
``docker-compose --profile scale up -d haproxy``: Redis, the replicas ``api-1``, ``api-2``, ``api-3`` and
HAProxy in front of them. Every container uses the host's network, each Compose service name
resolving to its own loopback address (as in test_containers.py); on the host's network there is no
Docker DNS, so HAProxy reads the replicas' addresses once at start (the test's copy of
deploy/haproxy.cfg drops its ``resolvers`` and nothing else).

Addresses: HAProxy on 127.0.0.1:8000 (HTTP), 127.0.0.1:8001 (gRPC) and 127.0.0.1:8404 (its stats);
the replicas on 127.0.0.1 at the ports the Compose file gives each (8010, 8020, 8030; gRPC 8011, ...).
Clients here: httpx with no retries (every failure counted), the project's SDK with its retries, and
tritonclient over gRPC.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import logging
import re
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from typing_extensions import Self

from tests.deploy import prometheus_adapter
from tests.deploy.docker_engine import (
    Engine,
    engine_with_stand_ins,
    host_network_variant,
    make_haproxy_stand_in,
    wait_ready,
)
from tests.deploy.parsing import ROOT, parse_haproxy

pytestmark = pytest.mark.docker

COMPOSE_FILE = ROOT / "docker-compose.yml"
HAPROXY_CFG = ROOT / "deploy" / "haproxy.cfg"
PROJECT = "attnserve-scale"
PROFILE = ["--profile", "scale"]
REPLICAS = ("api-1", "api-2", "api-3")
SAMPLE = ROOT / "models" / "vit" / "1" / "sample-9-ankle-boot.png"
SENTENCES = (ROOT / "benchmarks" / "translate_sentences.txt").read_text().splitlines()
FIGURES: dict[str, object] = {}  # what the docs quote: printed at the end of the module (pytest -s)


def resolved_config(engine: Engine) -> dict:
    """docker-compose.yml as Compose resolves it with the profile ``scale``."""
    proc = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE_FILE), *PROFILE, "config"],
        env={k: v for k, v in engine.env.items() if k != "MODELS_DIR"},
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return yaml.safe_load(proc.stdout)


def haproxy_on_the_host_network(text: str) -> str:
    """deploy/haproxy.cfg where no Docker DNS answers: without its ``resolvers`` section and the servers'
    use of it, so HAProxy resolves each name once, at start, from /etc/hosts (the ``extra_hosts`` of the
    host-network variant). Nothing else changes."""
    text = re.sub(r"^resolvers docker\n(?:[ \t]+\S.*\n)*", "", text, flags=re.MULTILINE)
    text = text.replace(" resolvers docker", "")
    assert not re.search(r"^\s*[^#\s].*\bresolvers\b", text, re.MULTILINE), text
    return text


def frontend_ports(text: str) -> dict[str, int]:
    """The port each ``frontend`` of an HAProxy configuration binds."""
    return {
        name: int(line[1].rsplit(":", 1)[1])
        for (kind, name), lines in parse_haproxy(text).items()
        if kind == "frontend"
        for line in lines
        if line[0] == "bind"
    }


@dataclass
class Stack:
    """The running profile: HAProxy's addresses, each replica's ports, and the docker commands on it."""

    engine: Engine
    file: Path
    url: str  # HAProxy, HTTP
    grpc: str  # HAProxy, gRPC (host:port)
    stats: str  # HAProxy's statistics as CSV
    replicas: dict[str, tuple[int, int]]  # service -> (HTTP port, gRPC port)

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        command = ["docker-compose", "-p", PROJECT, "-f", str(self.file), *PROFILE, *args]
        proc = subprocess.run(
            command, env=self.engine.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        assert not check or proc.returncode == 0, f"{' '.join(args)}: {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
        return proc

    def container(self, service: str) -> str:
        label = f"label=com.docker.compose.service={service}"
        (found,) = self.engine.docker("ps", "-aq", "--filter", label).stdout.split()
        return found

    def replica_url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.replicas[service][0]}"

    def servers(self, backend: str = "api-http") -> dict[str, dict[str, str]]:
        """HAProxy's view of each server of ``backend``: its row of /stats;csv (status, retries, ...)."""
        text = httpx.get(f"{self.stats};csv", timeout=5).text.removeprefix("# ")
        rows = csv.DictReader(io.StringIO(text))
        return {r["svname"]: r for r in rows if r["pxname"] == backend and r["svname"] not in ("FRONTEND", "BACKEND")}

    def wait_status(self, service: str, status: str, timeout: float = 120) -> float:
        """Seconds until HAProxy reports ``service`` in ``status`` (``UP``, ``DOWN``)."""
        started = time.monotonic()
        while (now := self.servers()[service]["status"]) != status:
            assert time.monotonic() - started < timeout, f"{service} still {now} after {timeout} s, not {status}"
            time.sleep(0.05)
        return time.monotonic() - started


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    try:
        with engine_with_stand_ins(tmp_path_factory.mktemp("docker"), FIGURES) as (engine, services):
            make_haproxy_stand_in(engine, services["haproxy"]["image"])
            yield engine
    finally:
        print("\nreplica figures:", json.dumps(FIGURES))


@pytest.fixture(scope="module")
def cpu_image(engine):
    tag = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["api-1"]["image"]
    started = time.monotonic()
    engine.docker("build", "--network", "host", "--target", "cpu", "-t", tag, str(ROOT), timeout=900)
    FIGURES["cpu image build (s)"] = round(time.monotonic() - started, 1)
    return tag


def start_stack(engine: Engine) -> Stack:
    """``up -d haproxy`` of the host-network variant; returns once every replica is ready and UP in HAProxy."""
    config = resolved_config(engine)
    services = config["services"]
    replicas = {
        name: (int(services[name]["environment"]["ATTNSERVE_PORT"]), int(services[name]["environment"]["ATTNSERVE_GRPC_PORT"]))
        for name in REPLICAS
    }  # fmt: skip
    cfg_text = HAPROXY_CFG.read_text()
    ports = frontend_ports(cfg_text)
    config, _ = host_network_variant(config)
    cfg = engine.folder / "haproxy.cfg"
    cfg.write_text(haproxy_on_the_host_network(cfg_text))
    (mount,) = services["haproxy"]["volumes"]
    services["haproxy"]["volumes"] = [f"{cfg}:{mount.split(':', 1)[1]}"]
    for port in [*ports.values(), *(p for pair in replicas.values() for p in pair), 6379]:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} is taken: the stack runs on the host's network"
    file = engine.folder / "compose.scale.hostnet.yml"
    file.write_text(yaml.safe_dump(config, sort_keys=False))
    stack = Stack(
        engine,
        file,
        url=f"http://127.0.0.1:{ports['http']}",
        grpc=f"127.0.0.1:{ports['grpc']}",
        stats=f"http://127.0.0.1:{ports['stats']}/stats",
        replicas=replicas,
    )
    started = time.monotonic()
    stack.compose("up", "-d", "haproxy")
    try:
        for name in REPLICAS:
            wait_ready(stack.replica_url(name), 120)
            stack.wait_status(name, "UP", 30)
    except AssertionError:
        raise AssertionError(stack.compose("logs", "--no-color", check=False).stdout[-6000:]) from None
    FIGURES["compose up to three replicas UP in HAProxy (s)"] = round(time.monotonic() - started, 1)
    return stack


@pytest.fixture(scope="module")
def stack(engine, cpu_image) -> Iterator[Stack]:
    stack = start_stack(engine)
    yield stack
    stack.compose("down", "-v", "--remove-orphans", check=False)


# --- clients -------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: str
    started: float  # time.monotonic()
    ended: float
    error: str | None  # None: the answer expected


def http_calls(url: str) -> dict[str, Callable[[httpx.Client, int], None]]:
    """One request of each kind, through plain httpx (no retries: every failure is seen)."""
    image = SAMPLE.read_bytes()

    def classify(http: httpx.Client, i: int) -> None:
        r = http.post(f"{url}/classify", files={"file": ("shoe.png", image, "image/png")}, data={"top_k": "1"})
        assert r.status_code == 200, f"{r.status_code} {r.text[:200]}"
        assert r.json()["results"][0]["top_k"][0]["label"] == "Ankle boot"

    def translate(http: httpx.Client, i: int) -> None:
        texts = [SENTENCES[i % len(SENTENCES)], SENTENCES[(i + 1) % len(SENTENCES)]]
        r = http.post(f"{url}/translate", json={"texts": texts, "beam_size": 2})
        assert r.status_code == 200, f"{r.status_code} {r.text[:200]}"
        assert len(r.json()["results"]) == 2

    def stream(http: httpx.Client, i: int) -> None:
        body = {"text": SENTENCES[i % len(SENTENCES)], "stream": True}
        with http.stream("POST", f"{url}/translate", json=body) as r:
            assert r.status_code == 200, f"{r.status_code} {r.read()[:200]}"
            events = [line.removeprefix("event: ") for line in r.iter_lines() if line.startswith("event: ")]
        assert events[-1:] == ["done"] and events.count("token") >= 1, f"stream ended with {events[-3:]}"

    return {"classify": classify, "translate": translate, "stream": stream}


def grpc_call(address: str) -> Callable[[object, int], None]:
    import numpy as np
    import tritonclient.grpc as grpcclient

    image = np.array([SAMPLE.read_bytes()], dtype=object)

    def classify(client, i: int) -> None:
        images = grpcclient.InferInput("images", [1], "BYTES")
        images.set_data_from_numpy(image)
        top = grpcclient.InferRequestedOutput("probabilities", class_count=1)
        (label,) = client.infer("vit", [images], outputs=[top], client_timeout=60).as_numpy("probabilities")[0]
        assert label.decode().endswith("Ankle boot"), label

    return classify


class Load:
    """Closed-loop clients, each on a thread of its own with its own connection, until ``stop()``:
    ``clients`` maps a kind to how many of its clients run. Every call's outcome is kept."""

    def __init__(self, calls: dict[str, Callable], clients: dict[str, int], connect: dict[str, Callable]) -> None:
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(kind, calls[kind], connect[kind], n), daemon=True)
            for kind, count in clients.items()
            for n in range(count)
        ]

    def _run(self, kind: str, call: Callable, connect: Callable, n: int) -> None:
        i = n * 1000
        with connect() as conn:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    call(conn, i)
                    error = None
                except Exception as e:  # noqa: BLE001 (every failure is an outcome to count, whatever its kind)
                    error = f"{type(e).__name__}: {e}"[:300]
                with self._lock:
                    self.outcomes.append(Outcome(kind, started, time.monotonic(), error))
                i += 1

    def __enter__(self) -> Self:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def count(self) -> dict[str, Counter]:
        out: dict[str, Counter] = {}
        for o in self.outcomes:
            out.setdefault(o.kind, Counter())["ok" if o.error is None else "failed"] += 1
        return out

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.error is not None]


def sdk_calls() -> dict[str, Callable]:
    """The same work through the project's SDK, with its retries; ``batch`` is a request whose body is over
    HAProxy's 16 KiB buffer (32 images), which HAProxy cannot replay: only the client can."""

    def classify(client, i: int) -> None:
        assert client.classify(SAMPLE, top_k=1).results[0].top_k[0].label == "Ankle boot"

    def batch(client, i: int) -> None:
        assert len(client.classify([SAMPLE] * 32, top_k=1).results) == 32

    def translate(client, i: int) -> None:
        texts = [SENTENCES[i % len(SENTENCES)], SENTENCES[(i + 1) % len(SENTENCES)]]
        assert len(client.translate(texts, beam_size=2).results) == 2

    def stream(client, i: int) -> None:
        events = [e.type for e in client.translate_stream(SENTENCES[i % len(SENTENCES)])]
        assert events[-1] == "done" and "token" in events, events

    return {"classify": classify, "batch": batch, "translate": translate, "stream": stream}


class RetryLog(logging.Handler):
    """The SDK's retry decisions (``attnserve_client`` logs one line per retry)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> Self:
        logger = logging.getLogger("attnserve_client")
        logger.addHandler(self)
        logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("attnserve_client").removeHandler(self)


def http_load(stack: Stack, clients: dict[str, int], with_grpc: int = 0) -> Load:
    calls: dict[str, Callable] = http_calls(stack.url)
    connect: dict[str, Callable] = {kind: lambda: httpx.Client(timeout=120) for kind in calls}
    if with_grpc:
        import tritonclient.grpc as grpcclient

        calls["grpc"] = grpc_call(stack.grpc)
        connect["grpc"] = lambda: contextlib.closing(grpcclient.InferenceServerClient(stack.grpc))
        clients = {**clients, "grpc": with_grpc}
    return Load(calls, clients, connect)


def retry_counters(stack: Stack) -> dict[str, int]:
    """HAProxy's retries and redispatches so far, over every replica of both backends."""
    rows = [*stack.servers("api-http").values(), *stack.servers("api-grpc").values()]
    return {
        "retries": sum(int(r["wretr"] or 0) for r in rows),
        "redispatches": sum(int(r["wredis"] or 0) for r in rows),
    }


def restart(stack: Stack, service: str) -> None:
    """Start a stopped replica again and wait until HAProxy sends it traffic."""
    stack.engine.docker("start", stack.container(service))
    stack.wait_status(service, "UP", 120)


# --- the configuration ------------------------------------------------------------------------------------


def haproxy_check(engine: Engine, text: str) -> subprocess.CompletedProcess:
    """``haproxy -c`` of ``text`` in the HAProxy stand-in, as the profile mounts it, with no Docker DNS."""
    folder = engine.folder / "haproxy-check"
    folder.mkdir(exist_ok=True)
    (folder / "haproxy.cfg").write_text(text)
    image = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["haproxy"]["image"]
    return engine.docker(
        "run", "--rm", "--network", "none", "-v", f"{folder}:/usr/local/etc/haproxy:ro",
        image, "haproxy", "-c", "-f", "/usr/local/etc/haproxy/haproxy.cfg", check=False,
    )  # fmt: skip


def test_haproxy_accepts_its_configuration(engine):
    """Debian's HAProxy 2.6 reads deploy/haproxy.cfg as written (the replicas' names unresolved, as before
    Docker's DNS knows them), and refuses it with one keyword misspelt."""
    text = HAPROXY_CFG.read_text()
    proc = haproxy_check(engine, text)
    assert proc.returncode == 0 and "Configuration file is valid" in proc.stdout + proc.stderr, proc.stderr
    proc = haproxy_check(engine, text.replace("retry-on ", "retry-of "))
    assert proc.returncode != 0 and "retry-of" in proc.stderr, proc.stderr


# --- three replicas as one service ----------------------------------------------------------------------------


def test_haproxy_balances_http_and_grpc_over_every_replica(stack):
    """Requests through HAProxy reach all three replicas, over HTTP and over gRPC (each call its own
    HTTP/2 stream, balanced one by one over HAProxy's connections to the replicas)."""
    import tritonclient.grpc as grpcclient

    def served(route: str) -> dict[str, float]:
        out = {}
        for name in REPLICAS:
            text = httpx.get(f"{stack.replica_url(name)}/metrics", timeout=10).text
            found = re.findall(
                rf'^attnserve_http_requests_total\{{[^}}]*route="{re.escape(route)}"[^}}]*\}} (\S+)', text, re.MULTILINE
            )
            out[name] = sum(map(float, found))
        return out

    before = served("/classify"), served("grpc:ModelInfer")
    calls = http_calls(stack.url)
    with httpx.Client(timeout=60) as http:
        for i in range(30):
            calls["classify"](http, i)
    client = grpcclient.InferenceServerClient(stack.grpc)
    classify = grpc_call(stack.grpc)
    for i in range(30):
        classify(client, i)
    client.close()
    after = served("/classify"), served("grpc:ModelInfer")
    for b, a, what in zip(before, after, ("HTTP", "gRPC")):
        counts = {name: a[name] - b[name] for name in REPLICAS}
        FIGURES[f"{what} calls per replica, of 30"] = counts
        assert sum(counts.values()) == 30 and all(counts.values()), f"{what}: {counts}"


def test_an_attention_id_made_through_one_replica_is_served_by_every_replica(stack):
    """The attention maps live in the stack's Redis: an id made through HAProxy (by whichever replica)
    is read directly from each replica's own port."""
    made = []
    with httpx.Client(base_url=stack.url, timeout=60) as http:
        with SAMPLE.open("rb") as f:
            r = http.post("/classify", files={"file": f}, data={"return_attention": "true"})
        assert r.status_code == 200, r.text
        made.append(r.json()["results"][0]["attention_id"])
        r = http.post("/translate", json={"text": SENTENCES[0], "return_attention": True, "beam_size": 1})
        assert r.status_code == 200, r.text
        made.append(r.json()["results"][0]["attention_id"])
    assert all(made), made
    for name in REPLICAS:
        with httpx.Client(base_url=stack.replica_url(name), timeout=60) as http:
            for attention_id in made:
                r = http.get(f"/attention/{attention_id}", params={"layer": 0, "head": 0})
                assert r.status_code == 200 and r.json()["id"] == attention_id, (name, r.status_code, r.text[:200])
                png = http.get(f"/attention/{attention_id}.png")
                assert png.status_code == 200 and png.content.startswith(b"\x89PNG"), name


# --- the response cache, shared through the stack's Redis ---------------------------------------------------


@contextlib.contextmanager
def response_cache(stack: Stack) -> Iterator[None]:
    """The three replicas recreated with ``ATTNSERVE_RESPONSE_CACHE=true`` (the profile leaves it off, so that
    the load of the other tests is computed), and recreated as they were afterwards."""
    config = yaml.safe_load(stack.file.read_text())
    for name in REPLICAS:
        config["services"][name]["environment"]["ATTNSERVE_RESPONSE_CACHE"] = "true"
    cached = dataclasses.replace(stack, file=stack.file.with_name("compose.scale.hostnet.cache.yml"))
    cached.file.write_text(yaml.safe_dump(config, sort_keys=False))

    def recreate(on: Stack) -> None:
        on.compose("up", "-d", *REPLICAS)
        for name in REPLICAS:
            wait_ready(stack.replica_url(name), 120)
            stack.wait_status(name, "UP", 30)

    recreate(cached)
    try:
        yield
    finally:
        recreate(stack)


def cache_lookups(stack: Stack, operation: str) -> dict[str, float]:
    """Each replica's response-cache hits for ``operation``, read on its own port."""
    out = {}
    for name in REPLICAS:
        text = httpx.get(f"{stack.replica_url(name)}/metrics", timeout=10).text
        found = re.search(
            rf'^attnserve_response_cache_lookups_total\{{operation="{operation}",result="hit"\}} (\S+)$',
            text,
            re.MULTILINE,
        )
        out[name] = float(found[1]) if found else 0.0
    return out


def test_a_cached_answer_made_on_one_replica_is_a_hit_on_the_others(stack):
    """With the response cache on, a translation and a classification computed by one replica (asked on
    its own port) are answered from the stack's Redis by the two others, byte for byte, and through
    HAProxy by whichever replica it picks; each replica's own /metrics shows where the hits happened."""
    texts = ["Shows the version number and exits.", "Removes the selected packages."]
    image = SAMPLE.read_bytes()
    with response_cache(stack):
        first, *others = REPLICAS
        made = httpx.post(f"{stack.replica_url(first)}/translate", json={"texts": texts}, timeout=120)
        assert made.status_code == 200 and made.headers["x-cache"] == "miss", (made.status_code, made.text[:200])
        shown = httpx.post(f"{stack.replica_url(others[0])}/classify", files={"file": image}, timeout=60)
        assert shown.status_code == 200 and shown.headers["x-cache"] == "miss", shown.text[:200]
        before = cache_lookups(stack, "translate"), cache_lookups(stack, "classify")
        for name in others:
            r = httpx.post(f"{stack.replica_url(name)}/translate", json={"texts": texts}, timeout=120)
            assert r.status_code == 200 and r.headers["x-cache"] == "hit" and r.content == made.content, name
        for name in (first, others[1]):
            r = httpx.post(f"{stack.replica_url(name)}/classify", files={"file": image}, timeout=60)
            assert r.status_code == 200 and r.headers["x-cache"] == "hit" and r.content == shown.content, name
        after = cache_lookups(stack, "translate"), cache_lookups(stack, "classify")
        translated = {name: after[0][name] - before[0][name] for name in REPLICAS}
        classified = {name: after[1][name] - before[1][name] for name in REPLICAS}
        assert translated == {first: 0, others[0]: 2, others[1]: 2}, translated
        assert classified == {first: 1, others[0]: 0, others[1]: 1}, classified
        with httpx.Client(base_url=stack.url, timeout=120) as http:
            through = [http.post("/translate", json={"texts": texts}) for _ in range(9)]
        assert all(r.status_code == 200 and r.headers["x-cache"] == "hit" for r in through)
        assert all(r.content == made.content for r in through)
        final = cache_lookups(stack, "translate")
        FIGURES["response cache: translate hits per replica"] = {
            name: final[name] - before[0][name] for name in REPLICAS
        }


# --- a rolling restart -----------------------------------------------------------------------------------


def test_rolling_restart_under_load_fails_no_request(stack):
    """Each replica in turn gets SIGTERM (``docker stop``) and is started again, while clients send
    classifications, translations and streamed translations through HAProxy (and gRPC classifications):
    no HTTP request fails, every stream ends with its ``done`` event, and each replica drains in time
    (exit status 0)."""
    before = retry_counters(stack)
    timeline = []
    with http_load(stack, {"classify": 2, "translate": 2, "stream": 2}, with_grpc=1) as load:
        time.sleep(3)
        for name in REPLICAS:
            container = stack.container(name)
            sigterm = time.monotonic()
            # SIGTERM, SIGKILL only after the stop grace period; HAProxy's view watched meanwhile
            stopping = threading.Thread(target=stack.engine.docker, args=("stop", container), kwargs={"timeout": 90})
            stopping.start()
            down = stack.wait_status(name, "DOWN", 30)
            stopping.join(120)
            stopped = time.monotonic() - sigterm
            state = stack.engine.inspect("container", container)["State"]
            assert state["ExitCode"] == 0 and not state["OOMKilled"], state
            restart(stack, name)
            timeline.append({"replica": name, "stopped (s)": round(stopped, 2), "marked down (s)": round(down, 2)})
            time.sleep(2)  # traffic on all three again before the next
    counts = {kind: dict(c) for kind, c in load.count().items()}
    after = retry_counters(stack)
    FIGURES["rolling restart"] = {
        "answers": counts,
        "HAProxy retries": after["retries"] - before["retries"],
        "HAProxy redispatches": after["redispatches"] - before["redispatches"],
        "per replica": timeline,
    }
    # gRPC included: a replica keeps taking calls for ATTNSERVE_DRAIN_DELAY_S after SIGTERM, its /readyz 503,
    # so HAProxy has taken it out before its gRPC server refuses a call (HAProxy does not replay those)
    assert load.failures() == [], load.failures()[:10]
    assert all(counts[kind]["ok"] > 0 for kind in ("classify", "translate", "stream", "grpc")), counts


def test_a_draining_replica_answers_readyz_503_before_it_stops_accepting(stack):
    """A replica given SIGTERM while it holds a long request keeps answering, ``/readyz`` 503 (draining),
    until the load balancer's checks have taken it out (two checks one second apart), and only then stops
    accepting; the request it held is answered."""
    name = REPLICAS[0]
    url, container = stack.replica_url(name), stack.container(name)
    body = {"texts": SENTENCES[:24], "beam_size": 4, "max_new_tokens": 96}
    result: dict[str, object] = {}

    def translate() -> None:
        try:
            result["r"] = httpx.post(f"{url}/translate", json=body, timeout=120)
        except httpx.HTTPError as e:
            result["r"] = e

    thread = threading.Thread(target=translate)
    # SIGTERM by `docker kill`, which returns once it is sent, and without the restart policy, which would
    # start the container again the moment it exits (as it does after a crash)
    policy = stack.engine.inspect("container", container)["HostConfig"]["RestartPolicy"]["Name"]
    stack.engine.docker("update", "--restart", "no", container)
    thread.start()
    try:
        wait_running(url, result)
        stack.engine.docker("kill", "-s", "TERM", container)
        sigterm = time.monotonic()
        statuses = []
        for _ in range(10):  # the first second of the drain
            try:
                r = httpx.get(f"{url}/readyz", timeout=2)
                statuses.append(r.status_code if r.status_code != 503 else r.json()["status"])
            except httpx.TransportError as e:
                statuses.append(type(e).__name__)
            time.sleep(0.1)
        assert statuses == ["draining"] * len(statuses), statuses
        stack.wait_status(name, "DOWN", 10)
        down = time.monotonic() - sigterm
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200, "stopped accepting before HAProxy knew"
        still_accepting = time.monotonic() - sigterm
        FIGURES["draining replica"] = {
            "out of HAProxy after SIGTERM (s)": round(down, 2),
            "still accepting at (s)": round(still_accepting, 2),
        }
        thread.join(120)
        assert getattr(result["r"], "status_code", None) == 200, result  # the request in flight is answered
    finally:
        thread.join(120)
        # the drain is bounded (the delay and 30 s, then the lifespan's shutdown): a process still there
        # after 60 s is killed by `docker stop`, and that fails the test
        stack.engine.docker("stop", "-t", "60", container, timeout=120)
        state = stack.engine.inspect("container", container)["State"]
        logs = stack.engine.docker("logs", "--timestamps", "--tail", "400", container, check=False)
        stack.engine.docker("update", "--restart", policy, container)
        restart(stack, name)
        if state["ExitCode"] != 0:
            lines = [ln for ln in (logs.stdout + logs.stderr).splitlines() if "attnserve.access" not in ln]
            pytest.fail(f"{name} did not end its drain (request: {result}, {state}):\n" + "\n".join(lines[-40:]))


def wait_running(url: str, result: dict, timeout: float = 30) -> None:
    """Until the replica at ``url`` holds a request for the decoder (its waiting- or running-sequences gauge
    above zero: the waiting one is set as the request is queued, the running one after each hop of steps);
    ``result`` says how the request ended if it ended first."""
    held = re.compile(r"^attnserve_(running|waiting)_sequences\{[^}]*\} [1-9]", re.MULTILINE)
    deadline = time.monotonic() + timeout
    while not held.search(httpx.get(f"{url}/metrics", timeout=10).text):
        if result or time.monotonic() > deadline:
            pytest.fail(f"the request never reached the decoder: {result}")
        time.sleep(0.02)


# --- slow clients -----------------------------------------------------------------------------------------


def test_half_open_connections_to_haproxy_and_to_a_replica_lock_no_one_out(stack):
    """Thousands of connections sending a request line and a header line now and then, never the end of
    their headers (slowloris), to HAProxy's port and straight to one replica's: another client is still
    answered through both, and every half-open connection is closed after the header timeout (HAProxy's
    ``timeout http-request``, the replica's ``ATTNSERVE_HEADER_TIMEOUT_S``, 10 s each)."""
    import asyncio

    from tests.service.http.test_slow_clients import half_open, trickle, until_closed
    from tests.service.service_testing import metric_value

    name, each = REPLICAS[1], 2000  # under HAProxy's frontend maxconn (3000) and the replica's bound (4096)
    ports = {"haproxy": int(stack.url.rsplit(":", 1)[1]), name: stack.replicas[name][0]}
    urls = {"haproxy": stack.url, name: stack.replica_url(name)}
    image = SAMPLE.read_bytes()
    before = httpx.get(f"{urls[name]}/metrics", timeout=10).text

    async def attack() -> dict:
        opened = time.monotonic()
        conns = {where: [] for where in ports}
        for where, port in ports.items():
            for i in range(0, each, 250):
                conns[where] += await asyncio.gather(*(half_open("127.0.0.1", port) for _ in range(250)))
        open_s = time.monotonic() - opened
        stop = asyncio.Event()
        trickling = asyncio.create_task(trickle([w for c in conns.values() for _, w in c], stop))
        await asyncio.sleep(0.5)
        answers = {}
        async with httpx.AsyncClient(timeout=10) as client:  # another client, meanwhile
            for where, url in urls.items():
                started = time.monotonic()
                r = await client.post(f"{url}/classify", files={"file": ("shoe.png", image, "image/png")})
                answers[where] = (r.status_code, round(time.monotonic() - started, 3))
        held = time.monotonic() - opened
        ends = {where: await asyncio.gather(*(until_closed(r, 30) for r, _ in c)) for where, c in conns.items()}
        closed_s = time.monotonic() - opened
        stop.set()
        await trickling
        for c in conns.values():
            for _, w in c:
                w.close()
        return {
            "open_s": round(open_s, 1),
            "held_s": held,
            "closed_s": round(closed_s, 1),
            "answers": answers,
            "still_open": {where: sum(e is None for e in e_) for where, e_ in ends.items()},
            "408": {where: sum(bool(e and b" 408 " in e[:20]) for e in e_) for where, e_ in ends.items()},
        }

    out = asyncio.run(attack())
    after = httpx.get(f"{urls[name]}/metrics", timeout=10).text

    def closed(reason: str) -> float:
        metric = "attnserve_http_connections_closed_total"
        return metric_value(after, metric, reason=reason) - metric_value(before, metric, reason=reason)

    FIGURES["slow clients"] = {
        "half-open per port": each,
        **{k: v for k, v in out.items() if k != "held_s"},
        f"{name} closed": {reason: closed(reason) for reason in ("header_timeout", "evicted", "refused")},
    }
    assert out["held_s"] < 10, "the other client came after the timeout: nothing was tested"
    assert all(status == 200 and wait < 2 for status, wait in out["answers"].values()), out["answers"]
    assert out["still_open"] == {where: 0 for where in ports}, out
    # by the header timeout, or evicted where the replica's open-file limit makes its bound lower than 2,000
    assert closed("header_timeout") + closed("evicted") == each, FIGURES["slow clients"]


# --- a replica killed -------------------------------------------------------------------------------------


def kill_under(stack: Stack, load: Load, service: str) -> dict[str, float]:
    """``kill -9`` ``service`` under ``load``, then start it again (``docker kill`` counts as a stop by
    hand: the restart policy leaves it stopped); when (in the load's clock) the kill was sent, when
    HAProxy had the replica DOWN, and when UP again."""
    container = stack.container(service)
    time.sleep(3)
    killed = time.monotonic()
    stack.engine.docker("kill", "-s", "KILL", container)
    down = killed + stack.wait_status(service, "DOWN", 10)
    assert stack.engine.inspect("container", container)["State"]["ExitCode"] == 137
    time.sleep(3)  # traffic on the other two only
    restart(stack, service)
    up = time.monotonic()
    time.sleep(2)  # traffic on all three again
    return {"killed": killed, "down": down, "up": up}


def test_kill_9_fails_only_requests_in_flight_on_the_killed_replica(stack):
    """``kill -9`` of one replica under load, clients without retries: HAProxy replays what it can (a
    request it holds whole that got no answer), so what fails is what was in flight on that replica and
    could not be replayed (a stream already answering); nothing sent after HAProxy marked it down fails."""
    before = retry_counters(stack)
    with http_load(stack, {"classify": 2, "translate": 2, "stream": 2}, with_grpc=1) as load:
        times = kill_under(stack, load, REPLICAS[1])
    killed, down = times["killed"], times["down"]
    failures = load.failures()
    after = retry_counters(stack)
    FIGURES["kill -9"] = {
        "answers": {kind: dict(c) for kind, c in load.count().items()},
        "failed, by kind": dict(Counter(f.kind for f in failures)),
        "marked down after (s)": round(down - killed, 2),
        "HAProxy retries": after["retries"] - before["retries"],
        "HAProxy redispatches": after["redispatches"] - before["redispatches"],
    }
    in_flight = [f for f in failures if f.started < down and f.ended < down + 1]
    assert failures == in_flight, [f for f in failures if f not in in_flight]
    assert not [f for f in load.outcomes if f.started > down and f.error], "a request failed after the replica was down"


def test_sdk_retries_turn_what_fails_on_a_killed_replica_into_answers(stack):
    """The same with the SDK's clients (2 retries, backoff): no classification or translation fails, not
    even a batch of 32 images, whose body is over HAProxy's buffer so that HAProxy cannot replay it. A
    stream already answering when its replica dies is cut off and cannot be retried without repeating its
    tokens; those are counted."""
    from attnserve_client import Client

    calls = sdk_calls()
    connect = {kind: lambda: Client(base_url=stack.url, max_retries=2, timeout=120) for kind in calls}
    with RetryLog() as retries, Load(calls, {"classify": 2, "batch": 2, "translate": 2, "stream": 2}, connect) as load:
        times = kill_under(stack, load, REPLICAS[2])
    killed, down = times["killed"], times["down"]
    failures = load.failures()
    FIGURES["kill -9, SDK clients"] = {
        "answers": {kind: dict(c) for kind, c in load.count().items()},
        "SDK retries": len(retries.lines),
        "marked down after (s)": round(down - killed, 2),
    }
    streams = [f for f in failures if f.kind == "stream"]
    assert all(f.started < down and f.ended < down + 1 for f in streams), streams
    # a batch too large for HAProxy to replay gets its 502 when its replica dies: the SDK sends it again
    others = [f for f in failures if f.kind != "stream"]
    assert others == [], others


# --- the benchmark ------------------------------------------------------------------------------------------


def test_bench_replicas_measures_one_two_and_three_replicas(stack, monkeypatch):
    """benchmarks/bench_replicas.py, briefly, against this profile: a row per route and replica count with
    sane figures, and every replica serving again afterwards."""
    from tests.conftest import run_module
    from tests.test_benchmarks import assert_sane_figures

    for name in ("DOCKER_HOST", "DOCKER_CONFIG"):  # the docker CLI it runs talks to this module's engine
        monkeypatch.setenv(name, stack.engine.env[name])
    args = ["--rounds", "1", "--duration", "1", "--warmup", "0", "--clients", "4", "--url", stack.url]
    proc = run_module("benchmarks.bench_replicas", *args, "--stats", stack.stats, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("POST /")]
    assert len(rows) == 6, proc.stdout
    assert_sane_figures(proc.stdout, ("POST /classify", "POST /translate"))
    assert {name: row["status"] for name, row in stack.servers().items()} == dict.fromkeys(REPLICAS, "UP")


# --- the autoscaler's metric, evaluated by Prometheus -------------------------------------------------------


def test_adapter_query_gives_each_pod_its_mean_queue_wait(engine):
    """deploy/k8s/prometheus-adapter.yaml's query, filled in as the adapter fills it for two pods, run by
    Prometheus's own engine (``promtool test rules``, in the Prometheus stand-in) on the series Prometheus
    would hold for the service's histogram: a pod whose 2 requests a second waited 0.2 s each answers 0.2,
    a pod that answered nothing answers 0, a pod of another namespace is left out."""
    adapter = yaml.safe_load((ROOT / "deploy" / "k8s" / "prometheus-adapter.yaml").read_text())
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    query = prometheus_adapter.render(rule["metricsQuery"], "attnserve", ["api-a", "api-b"])

    def series(name: str, pod: str, namespace: str, per_minute: float) -> dict:
        labels = f'model="vit",version="1",namespace="{namespace}",pod="{pod}"'
        return {"series": f"{name}{{{labels}}}", "values": f"0+{per_minute}x10"}  # one sample a minute

    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    series("attnserve_queue_wait_seconds_sum", "api-a", "attnserve", 24),
                    series("attnserve_queue_wait_seconds_count", "api-a", "attnserve", 120),
                    series("attnserve_queue_wait_seconds_sum", "api-b", "attnserve", 0),
                    series("attnserve_queue_wait_seconds_count", "api-b", "attnserve", 0),
                    series("attnserve_queue_wait_seconds_sum", "api-a", "elsewhere", 60),
                    series("attnserve_queue_wait_seconds_count", "api-a", "elsewhere", 60),
                ],
                "promql_expr_test": [
                    {
                        "expr": query,
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": '{pod="api-a"}', "value": 0.2},
                            {"labels": '{pod="api-b"}', "value": 0},
                        ],
                    }
                ],
            }
        ],
    }
    folder = engine.folder / "promtool"
    folder.mkdir(exist_ok=True)
    (folder / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    image = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["prometheus"]["image"]
    proc = engine.docker(
        "run", "--rm", "--network", "none", "-v", f"{folder}:/tests:ro", "--entrypoint", "promtool",
        image, "test", "rules", "/tests/tests.yml", check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
