"""The images built and run for real: a private dockerd, the project's Dockerfile and Compose file.

Builds the stand-in bases (tests/deploy/docker_engine.py), the ``cpu`` image with the legacy builder
(what Compose v1 uses) and the ``gpu`` image with BuildKit on a CUDA stand-in, runs containers from
them, and brings up the Compose stack (API, Redis, Prometheus) with Debian's docker-compose.

Network rule: the daemon creates no bridge and no NAT rules; every container uses the host's network
(``--network host``; for Compose, ``network_mode: host`` in a test-only variant of the resolved file
that changes nothing but the networking), and every request goes to 127.0.0.1. Each Compose service
name resolves, inside the containers and here, to its own loopback address (127.0.0.2, ...), so a
service that reaches another by a wrong name or by ``localhost`` is caught.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import yaml

from tests.deploy.docker_engine import (
    engine_with_stand_ins,
    host_network_variant,
    wait_ready,
)
from tests.deploy.parsing import ROOT, parse_dockerfile
from tests.service.service_testing import free_port

pytestmark = pytest.mark.docker

COMPOSE_FILE = ROOT / "docker-compose.yml"
SAMPLE = ROOT / "models" / "vit" / "1" / "sample-9-ankle-boot.png"
SENTENCES = (ROOT / "benchmarks" / "translate_sentences.txt").read_text().splitlines()
FIGURES: dict[str, object] = {}  # what the docs quote: printed at the end of the module (pytest -s)


def compose_config() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    try:
        with engine_with_stand_ins(tmp_path_factory.mktemp("docker"), FIGURES) as (engine, _):
            yield engine
    finally:
        print("\ncontainer figures:", json.dumps(FIGURES))


def build(engine, target: str, tag: str, buildkit: bool) -> str:
    started = time.monotonic()
    extra = ["--progress", "plain"] if buildkit else []
    proc = engine.docker(
        "build", *extra, "--network", "host", "--target", target, "-t", tag, str(ROOT),
        timeout=900, DOCKER_BUILDKIT=str(int(buildkit)),
    )  # fmt: skip
    FIGURES[f"{tag} build (s)"] = round(time.monotonic() - started, 1)
    FIGURES[f"{tag} size (MB)"] = round(engine.inspect("image", tag)["Size"] / 1e6)
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def cpu_image(engine):
    tag = compose_config()["services"]["api-cpu"]["image"]
    return tag, build(engine, "cpu", tag, buildkit=False)


@pytest.fixture(scope="module")
def gpu_image(engine):
    tag = compose_config()["services"]["api"]["image"]
    return tag, build(engine, "gpu", tag, buildkit=True)


def run_api(engine, image: str, name: str, port: int, grpc_port: int = 0) -> str:
    """Start the service in a container on the host's network, HTTP on ``port`` (gRPC on ``grpc_port``,
    0: off), and wait until it is ready."""
    env = ["-e", f"ATTNSERVE_PORT={port}", "-e", f"ATTNSERVE_GRPC_PORT={grpc_port}"]
    engine.docker("run", "-d", "--name", name, "--network", "host", *env, image)
    url = f"http://127.0.0.1:{port}"
    running = lambda: engine.inspect("container", name)["State"]["Running"]
    try:
        FIGURES[f"{name} ready (s)"] = round(wait_ready(url, 120, running), 1)
    except AssertionError:
        raise AssertionError(engine.docker("logs", name, check=False).stderr[-3000:]) from None
    return url


@pytest.fixture(scope="module")
def api(engine, cpu_image):
    grpc_port = free_port()
    url = run_api(engine, cpu_image[0], "attnserve-api", free_port(), grpc_port)
    yield "attnserve-api", url, grpc_port
    engine.docker("rm", "-f", "attnserve-api", check=False)


def built_stages(log: str) -> list[str]:
    """The stages a legacy build log went through, in order (``Step i/n : FROM base AS name``)."""
    return [m[2] or m[1] for m in re.finditer(r"Step \d+/\d+ : FROM (\S+)(?: AS (\S+))?", log, re.IGNORECASE)]


# --- the cpu image -----------------------------------------------------------------------------------


def test_legacy_build_of_the_cpu_target_builds_only_its_stages(engine, cpu_image):
    tag, log = cpu_image
    assert built_stages(log) == ["models-shipped", "models", "build-cpu", "cpu"]
    assert "make models" not in log and "torch" not in log
    # no torch in the runtime image, and the service's own modules import without it
    probe = "import importlib.util as u, sys; import service.http.app; sys.exit(u.find_spec('torch') is not None)"
    engine.docker("run", "--rm", "--network", "host", tag, "python", "-c", probe)


def test_container_serves_both_models_and_their_attention(api):
    _, url, _ = api
    with httpx.Client(base_url=url, timeout=30) as http:
        models = {m["name"]: m for m in http.get("/models").json()["models"]}
        assert {"vit", "translator"} <= set(models)
        with SAMPLE.open("rb") as f:
            r = http.post("/classify", files={"file": f}, data={"top_k": "3", "return_attention": "true"})
        assert r.status_code == 200, r.text
        (result,) = r.json()["results"]
        assert result["top_k"][0]["label"] == "Ankle boot"
        png = http.get(f"/attention/{result['attention_id']}.png")
        assert png.status_code == 200 and png.headers["content-type"] == "image/png"
        assert png.content.startswith(b"\x89PNG\r\n\x1a\n") and len(png.content) > 1000
        r = http.post("/translate", json={"text": "Saves the current document.", "beam_size": 1})
        assert r.status_code == 200, r.text
        assert r.json()["results"][0]["translation"] == "Speichert das aktuelle Dokument."
        assert http.get("/missing").json()["error"]["code"] == "not_found"


def classify_over_grpc(address: str) -> list[str]:
    """The top-3 labels of the sample image, asked with NVIDIA's tritonclient over gRPC."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(address)
    assert client.is_server_ready() and client.is_model_ready("vit")
    images = grpcclient.InferInput("images", [1], "BYTES")
    images.set_data_from_numpy(np.array([SAMPLE.read_bytes()], dtype=object))
    top = grpcclient.InferRequestedOutput("probabilities", class_count=3)
    row = client.infer("vit", [images], outputs=[top]).as_numpy("probabilities")[0]
    return [v.decode().split(":")[-1] for v in row]


def test_container_answers_grpc(api):
    _, _, grpc_port = api
    assert classify_over_grpc(f"127.0.0.1:{grpc_port}")[0] == "Ankle boot"


def test_container_runs_as_the_unprivileged_user(engine, api):
    name, _, _ = api
    assert engine.inspect("container", name)["Config"]["User"] == "10001"
    assert engine.docker("exec", name, "id", "-u").stdout.strip() == "10001"
    # the service process itself (pid 1), not just a shell started beside it
    status = engine.docker("exec", name, "cat", "/proc/1/status").stdout
    assert re.search(r"^Uid:\s+10001\s", status, re.MULTILINE), status


def test_healthcheck_turns_healthy(engine, api):
    name, _, _ = api
    deadline = time.monotonic() + 60
    while (health := engine.inspect("container", name)["State"]["Health"])["Status"] != "healthy":
        assert health["Status"] == "starting" and time.monotonic() < deadline, health
        time.sleep(1)
    assert health["Log"][-1]["ExitCode"] == 0


def test_memory_of_a_serving_container(engine, api):
    name, _, _ = api
    stats = json.loads(engine.docker("stats", "--no-stream", "--format", "{{json .}}", name).stdout)
    used = stats["MemUsage"].split("/")[0].strip()
    FIGURES["cpu container memory"] = used
    number, unit = re.fullmatch(r"([\d.]+)\s*([KMG]i?B)", used).groups()
    mib = float(number) * {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[unit]
    assert 50 < mib < 1024, used


def test_stop_drains_in_flight_requests(engine, cpu_image):
    """SIGTERM from `docker stop` lets every request the service holds finish, within the stop timeout."""
    name, timeout = "attnserve-drain", 30
    url = run_api(engine, cpu_image[0], name, free_port())
    try:
        body = {"texts": SENTENCES[:12], "beam_size": 4, "max_new_tokens": 96}
        in_flight = threading.Event()

        def translate(_):
            with httpx.Client(base_url=url, timeout=120) as http:
                in_flight.set()
                return http.post("/translate", json=body)

        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(translate, i) for i in range(6)]
            in_flight.wait(10)
            deadline = time.monotonic() + 30
            while not re.search(
                r"^attnserve_running_sequences\{[^}]*\} [1-9]", httpx.get(f"{url}/metrics").text, re.MULTILINE
            ):
                assert time.monotonic() < deadline, "no request reached the decoder"
                time.sleep(0.05)
            started = time.monotonic()
            engine.docker("stop", "-t", str(timeout), name, timeout=timeout + 30)
            stopped = time.monotonic() - started
            answers = [f.result() for f in futures]
        FIGURES["docker stop with 6 requests in flight (s)"] = round(stopped, 1)
        assert [a.status_code for a in answers] == [200] * 6
        assert all(len(a.json()["results"]) == len(body["texts"]) for a in answers)
        state = engine.inspect("container", name)["State"]
        assert stopped < timeout and state["ExitCode"] == 0 and not state["OOMKilled"], state
    finally:
        engine.docker("rm", "-f", name, check=False)


# --- the gpu image, on a CUDA stand-in ------------------------------------------------------------------


def test_buildkit_build_of_the_gpu_target(engine, gpu_image):
    tag, log = gpu_image
    stages = set(re.findall(r"^#\d+ \[([\w-]+)\s+\d+/\d+\]", log, re.MULTILINE))
    assert stages == {"models-shipped", "build-gpu", "gpu"}, stages  # `models` only renames models-shipped
    assert "make models" not in log
    probe = "from onnxruntime.capi import build_and_package_info as b; print(b.package_name, b.cuda_version)"
    package, cuda = engine.docker("run", "--rm", tag, "python", "-c", probe).stdout.split()
    env = dict(e.split("=", 1) for e in engine.inspect("image", tag)["Config"]["Env"])
    assert package == "onnxruntime-gpu" and cuda.split(".")[0] == env["CUDA_VERSION"].split(".")[0]
    assert engine.inspect("image", tag)["Config"]["User"] == "10001"


def test_gpu_check_runs_inside_the_gpu_image(engine, gpu_image):
    """Every step of deploy/gpu_check.py that needs no GPU, in the image, with the CPU as the checked provider."""
    check = "python -m deploy.gpu_check --repository /models --provider cpu --seconds 0.5 --concurrency 2 --sentences 4"
    proc = engine.docker("run", "--rm", "--network", "host", gpu_image[0], *shlex.split(check), timeout=300)
    assert "GPU check: every check passed" in proc.stdout, proc.stdout[-3000:]
    assert "onnxruntime-gpu, built for CUDA 13" in proc.stdout


def test_cuda_major_guard_refuses_another_cuda_with_the_real_wheel(engine, gpu_image):
    """The build-gpu guard against the real onnxruntime-gpu in the image: a CUDA 12 base is refused."""
    (run,) = [i.args for i in parse_dockerfile().stage("build-gpu").all("RUN") if "CUDA_VERSION" in i.args]
    words = shlex.split(run)
    guard = words[words.index("-c") + 1]
    assert engine.docker("run", "--rm", gpu_image[0], "python", "-c", guard, check=False).returncode == 0
    proc = engine.docker("run", "--rm", "-e", "CUDA_VERSION=12.8.0", gpu_image[0], "python", "-c", guard, check=False)
    assert proc.returncode == 1 and "onnxruntime-gpu is built for CUDA 13" in proc.stderr, proc.stderr


# --- the Compose stack -------------------------------------------------------------------------------------

PROJECT = "attnserve-test"
PROFILES = ["--profile", "cpu", "--profile", "monitoring"]
STARTED = ["api-cpu", "prometheus"]  # and redis, which api-cpu depends on


def compose(engine, *args: str, file, timeout: float = 300, check: bool = True):
    command = ["docker-compose", "-p", PROJECT, "-f", str(file), *args]
    proc = subprocess.run(command, env=engine.env, capture_output=True, text=True, timeout=timeout, check=False)
    assert not check or proc.returncode == 0, f"{' '.join(args)}: {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return proc


def published(service: dict, setting: str) -> int:
    """The port the host reaches the service's ``setting`` port on: the one published for the port the
    service listens on, which on the host's network is the container's port itself."""
    listens = int(service["environment"][setting])
    (port,) = [int(p["target"]) for p in service["ports"] if int(p["target"]) == listens]
    return port


@pytest.fixture(scope="module")
def stack(engine, cpu_image):
    resolved = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE_FILE), *PROFILES, "config"],
        env={k: v for k, v in engine.env.items() if k != "MODELS_DIR"},
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    config = yaml.safe_load(resolved)
    api = config["services"]["api-cpu"]
    ports = {"api": published(api, "ATTNSERVE_PORT"), "grpc": published(api, "ATTNSERVE_GRPC_PORT")}
    (prometheus,) = config["services"]["prometheus"]["ports"]
    ports["prometheus"] = int(prometheus["target"])
    config, names = host_network_variant(config)
    for port in [*ports.values(), 6379]:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} is taken: the stack runs on the host's network"
    file = engine.folder / "compose.hostnet.yml"
    file.write_text(yaml.safe_dump(config, sort_keys=False))
    started = time.monotonic()
    compose(engine, *PROFILES, "up", "-d", *STARTED, file=file)
    url = f"http://127.0.0.1:{ports['api']}"
    try:
        wait_ready(url, 120)
    except AssertionError:
        raise AssertionError(compose(engine, "logs", "--no-color", file=file, check=False).stdout[-4000:]) from None
    FIGURES["compose up to ready (s)"] = round(time.monotonic() - started, 1)
    yield {"file": file, "url": url, "names": names, "ports": ports, "config": config}
    compose(engine, *PROFILES, "down", "-v", "--remove-orphans", file=file, check=False)


def containers(engine) -> list[str]:
    return engine.docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}").stdout.split()


def test_compose_stack_serves_both_models(stack):
    models = httpx.get(f"{stack['url']}/models", timeout=10).json()["models"]
    assert {(m["name"], m["provider"]) for m in models} >= {("vit", "CPUExecutionProvider")}
    assert {m["name"] for m in models} == {"vit", "translator"}
    assert classify_over_grpc(f"127.0.0.1:{stack['ports']['grpc']}")[0] == "Ankle boot"


def test_attention_maps_are_shared_through_redis(engine, stack):
    """An attention id made by one request survives the API's restart: it lives in the stack's Redis,
    reached by its service name."""
    import redis

    url = stack["url"]
    with SAMPLE.open("rb") as f:
        r = httpx.post(f"{url}/classify", files={"file": f}, data={"return_attention": "true"}, timeout=30)
    assert r.status_code == 200, r.text
    (result,) = r.json()["results"]
    attention_id = result["attention_id"]
    assert attention_id, result.get("attention_error")  # None, with the reason, when Redis is unreachable
    redis_service = stack["names"]["redis"]  # the address the stack's `redis` service name resolves to
    client = redis.Redis(host=redis_service, port=6379, socket_timeout=5)
    assert any(attention_id in key.decode() for key in client.scan_iter("*"))
    # the API is connected to that service (not to a Redis it found on localhost by a default)
    own = str(client.client_id())
    laddrs = {c["laddr"] for c in client.client_list() if c["id"] != own}
    assert f"{redis_service}:6379" in laddrs, laddrs
    compose(engine, "restart", "api-cpu", file=stack["file"])
    wait_ready(url, 120)
    again = httpx.get(f"{url}/attention/{attention_id}", timeout=30)
    assert again.status_code == 200 and again.json()["id"] == attention_id


def test_prometheus_scrapes_the_api(engine, stack):
    (prometheus,) = engine.docker("ps", "-q", "--filter", "label=com.docker.compose.service=prometheus").stdout.split()
    checked = engine.docker("exec", prometheus, "promtool", "check", "config", "/etc/prometheus/prometheus.yml")
    assert "SUCCESS" in checked.stdout + checked.stderr
    url = f"http://127.0.0.1:{stack['ports']['prometheus']}/api/v1/targets"
    deadline = time.monotonic() + 60
    while True:
        try:
            targets = httpx.get(url, timeout=5).json()["data"]["activeTargets"]
        except httpx.TransportError:
            targets = []
        if targets and all(t["health"] == "up" for t in targets):
            break
        assert time.monotonic() < deadline, targets
        time.sleep(1)
    assert {t["labels"]["job"] for t in targets} == {"attnserve"}
    assert all(t["scrapeUrl"].endswith("/metrics") for t in targets)


def test_compose_down_leaves_nothing_running(engine, stack):
    assert len(containers(engine)) == 3
    compose(engine, *PROFILES, "down", "-v", "--remove-orphans", file=stack["file"])
    assert containers(engine) == []
    assert set(engine.docker("ps", "--format", "{{.Names}}").stdout.split()) <= {"attnserve-api"}  # the module's own
    assert engine.docker("volume", "ls", "-q").stdout.split() == []
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", stack["ports"]["api"])) != 0
