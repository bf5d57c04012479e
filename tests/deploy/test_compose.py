"""docker-compose.yml: parsed by a real Compose implementation, and checked against the Dockerfile,
the service's settings and routes, and the files it mounts."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from urllib.parse import urlparse

import pytest
import yaml

from tests.ci import missing
from tests.conftest import SHIPPED_TRANSLATOR
from tests.deploy.parsing import (
    ROOT,
    attnserve_env,
    drain_seconds,
    duration_seconds,
    exec_form,
    parse_dockerfile,
    parse_haproxy,
    route_paths,
    settings_fields,
    settings_from,
)

COMPOSE_FILE = ROOT / "docker-compose.yml"
HAPROXY_CFG = ROOT / "deploy" / "haproxy.cfg"
REPLICAS = ("api-1", "api-2", "api-3")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())  # PyYAML resolves the `<<` merge keys as Compose does


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def docker_compose(*args: str, file=COMPOSE_FILE) -> subprocess.CompletedProcess:
    exe = shutil.which("docker-compose")
    if exe is None:
        missing("docker-compose is not installed (make system-deps installs Debian's docker-compose)")
    env = {k: v for k, v in os.environ.items() if k != "MODELS_DIR"}
    return subprocess.run(
        [exe, "-f", str(file), "--project-directory", str(ROOT), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_compose_parser_accepts_the_file():
    """Compose validates against its schema: an unknown or misplaced key fails here."""
    proc = docker_compose("--profile", "cpu", "--profile", "monitoring", "config")
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)["services"]
    assert set(resolved) == {"api", "api-cpu", "redis", "prometheus", "api-1", "api-2", "api-3", "haproxy"}
    devices = resolved["api"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert resolved["api"]["volumes"] == [f"{ROOT / 'models'}:/models:ro"]
    assert "deploy" not in resolved["api-cpu"]


def test_compose_parser_rejects_a_misspelt_key(tmp_path):
    """The check above can fail: the same parser on the file with one key misspelt."""
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_FILE.read_text().replace("stop_grace_period:", "stop_grace_periods:"))
    proc = docker_compose("config", file=broken)
    assert proc.returncode != 0 and "stop_grace_periods" in proc.stderr


def test_plain_up_starts_the_gpu_api_and_redis(compose, services):
    default = {name for name, s in services.items() if not s.get("profiles")}
    assert default == {"api", "redis"}
    assert services["api-cpu"]["profiles"] == ["cpu"] and services["prometheus"]["profiles"] == ["monitoring"]
    assert {name for name, s in services.items() if s.get("profiles") == ["scale"]} == {*REPLICAS, "haproxy"}


@pytest.mark.parametrize("name, target", [("api", "gpu"), ("api-cpu", "cpu")])
def test_api_builds_a_dockerfile_target(services, name, target):
    build = services[name]["build"]
    assert build["target"] == target and target in parse_dockerfile().names
    assert (ROOT / build["context"] / build.get("dockerfile", "Dockerfile")).is_file()


def test_gpu_reservation_and_no_silent_cpu_fallback(services, monkeypatch):
    (device,) = services["api"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"] and device["count"] >= 1
    settings = settings_from(attnserve_env(services["api"]["environment"]), monkeypatch)
    assert settings.require_gpu and settings.execution_provider == "cuda"
    cpu = settings_from(attnserve_env(services["api-cpu"]["environment"]), monkeypatch)
    assert not cpu.require_gpu and cpu.execution_provider == "cpu"
    assert "deploy" not in services["api-cpu"]


@pytest.mark.parametrize("name", ["api", "api-cpu"])
def test_api_settings_are_real_settings(services, name, monkeypatch):
    env = services[name]["environment"]
    names = {k.removeprefix("ATTNSERVE_").lower() for k in attnserve_env(env)}
    unknown = names - settings_fields()
    assert not unknown, f"not fields of service.settings.Settings (the service would refuse to start): {unknown}"
    settings = settings_from(attnserve_env(env), monkeypatch)
    assert settings.host == "0.0.0.0"
    assert settings.attention_store == "redis"
    redis = urlparse(settings.redis_url)
    assert redis.scheme == "redis" and redis.hostname in services and redis.port == 6379
    # published on the port the service listens on
    assert services[name]["ports"] == [f"8000:{settings.port}", f"8001:{settings.grpc_port}"]
    # the models volume is mounted where the service reads its repository, from a real repository
    (volume,) = services[name]["volumes"]
    source, target, mode = re.sub(r"\$\{MODELS_DIR:-([^}]+)\}", r"\1", volume).split(":")
    assert target == str(settings.model_repository) and mode == "ro"
    assert (ROOT / source / "vit" / "1" / "manifest.json").is_file()
    assert (ROOT / source / SHIPPED_TRANSLATOR.relative_to(ROOT / "models") / "manifest.json").is_file()


@pytest.mark.parametrize("name", ["api", "api-cpu", *REPLICAS])
def test_api_healthcheck_restart_and_drain(services, name, monkeypatch):
    s = services[name]
    dockerfile = parse_dockerfile()
    (hc,) = dockerfile.stage(s["build"]["target"]).all("HEALTHCHECK")
    assert s["healthcheck"]["test"] == ["CMD", *exec_form(hc.args.split(" CMD ", 1)[1])]
    assert "/readyz" in s["healthcheck"]["test"][-1] and "/readyz" in route_paths()
    assert s["restart"] in {"always", "unless-stopped", "on-failure"}
    settings = settings_from(attnserve_env(s["environment"]), monkeypatch)
    assert duration_seconds(s["stop_grace_period"]) > drain_seconds(settings), "Docker would kill the service mid-drain"
    assert s["depends_on"]["redis"]["condition"] == "service_healthy"


def test_redis(services):
    redis = services["redis"]
    assert redis["image"] == "redis:7-alpine"
    cmd = redis["command"]
    assert cmd[cmd.index("--maxmemory") + 1] == "256mb"
    assert cmd[cmd.index("--maxmemory-policy") + 1] == "allkeys-lru"
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"] and redis["restart"]


def test_prometheus_scrapes_the_api_metrics(services):
    prom = services["prometheus"]
    (volume,) = prom["volumes"]
    source, target, _ = volume.split(":")
    assert target == "/etc/prometheus/prometheus.yml"
    config = yaml.safe_load((ROOT / source).read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] in route_paths()
    (targets,) = [c["targets"] for c in job["static_configs"]]
    for t in targets:
        host, port = t.split(":")
        for name in ("api", "api-cpu"):  # whichever variant runs answers under this name
            api = services[name]
            aliases = api.get("networks", {}).get("default", {}).get("aliases", []) if name != host else [host]
            assert host in aliases, f"{name} is not reachable as {host}"
            assert port == api["environment"]["ATTNSERVE_PORT"]


# --- the profile `scale`: replicas behind HAProxy ------------------------------------------------------


@pytest.fixture(scope="module")
def haproxy() -> dict[tuple[str, str], list[list[str]]]:
    return parse_haproxy(HAPROXY_CFG.read_text())


def lines(section: list[list[str]], keyword: str) -> list[list[str]]:
    return [line[1:] for line in section if line[0] == keyword]


def test_replicas_are_the_cpu_service_on_ports_of_their_own(services, monkeypatch):
    """Three copies of the CPU service sharing Redis, each on its own HTTP and gRPC ports (so that the
    profile runs on the host's network too), none publishing a port: only HAProxy does."""
    ports = []
    for name in REPLICAS:
        replica = services[name]
        assert replica["build"] == services["api-cpu"]["build"] and replica["image"] == services["api-cpu"]["image"]
        assert not replica.get("ports") and replica["volumes"] == services["api-cpu"]["volumes"]
        env = attnserve_env(replica["environment"])
        assert {k.removeprefix("ATTNSERVE_").lower() for k in env} <= settings_fields()
        settings = settings_from(env, monkeypatch)
        assert settings.execution_provider == "cpu" and settings.attention_store == "redis"
        assert urlparse(settings.redis_url).hostname == "redis"
        ports += [settings.port, settings.grpc_port]
    assert len(set(ports)) == len(ports), ports


def test_haproxy_sends_http_and_grpc_to_every_replica(services, haproxy):
    """Each replica is a server of the HTTP backend (checked on /readyz) and of the gRPC backend (HTTP/2,
    up when the same replica's HTTP server is); HAProxy publishes exactly the ports it binds, which are
    the single API's, so clients do not change."""
    http, grpc = haproxy[("backend", "api-http")], haproxy[("backend", "api-grpc")]
    expected_http, expected_grpc = {}, {}
    for name in REPLICAS:
        env = services[name]["environment"]
        expected_http[name] = [f"{name}:{env['ATTNSERVE_PORT']}", "check"]
        expected_grpc[name] = [f"{name}:{env['ATTNSERVE_GRPC_PORT']}", "proto", "h2", "track", f"api-http/{name}"]
    assert {s[0]: s[1:] for s in lines(http, "server")} == expected_http
    assert {s[0]: s[1:] for s in lines(grpc, "server")} == expected_grpc
    assert lines(http, "option")[0] == ["httpchk", "GET", "/readyz"] and "/readyz" in route_paths()
    assert lines(http, "http-check") == [["expect", "status", "200"]]
    binds = {name: lines(section, "bind")[0] for (kind, name), section in haproxy.items() if kind == "frontend"}
    assert binds["grpc"][1:] == ["proto", "h2"]
    bound = {int(b[0].rsplit(":", 1)[1]) for b in binds.values()}
    published = {int(str(p).split(":")[-1]) for p in services["haproxy"]["ports"]}
    assert published == bound and {8000, 8001} <= published
    assert services["api-cpu"]["ports"] == ["8000:8000", "8001:8001"]  # what HAProxy stands in for
    (mount,) = services["haproxy"]["volumes"]
    source, target, mode = mount.split(":")
    assert (ROOT / source) == HAPROXY_CFG and target == "/usr/local/etc/haproxy/haproxy.cfg" and mode == "ro"
    assert set(services["haproxy"]["depends_on"]) == set(REPLICAS)


def test_haproxy_takes_a_stopping_replica_out_fast_and_tries_again_elsewhere(haproxy):
    """Checks every second (every 250 ms once one failed), two failures to take a replica out; a request
    a replica refused, or closed its connection on without answering, goes to another replica."""
    defaults = haproxy[("defaults", "")]
    (server,) = lines(defaults, "default-server")
    opts = dict(zip(server[::2], server[1::2]))
    assert duration_seconds(opts["inter"]) <= 1 and duration_seconds(opts["fastinter"]) <= 0.25
    assert int(opts["fall"]) == 2 and int(opts["rise"]) >= 2
    assert ["redispatch", "1"] in lines(defaults, "option") and int(lines(defaults, "retries")[0][0]) >= 1
    assert set(lines(defaults, "retry-on")[0]) == {"conn-failure", "empty-response"}
    # a request must be held whole to be tried again
    assert ["http-buffer-request"] in lines(defaults, "option")


def test_haproxy_bounds_connections_and_slow_clients_and_waits_out_deadlines(haproxy, monkeypatch):
    """A bound on connections, a limit on how long a request's headers may take (slow clients), and a
    server timeout no shorter than the longest deadline a request may ask for, so that the service, not
    HAProxy, ends a slow request with its own answer."""
    (maxconn,) = lines(haproxy[("global", "")], "maxconn")
    assert 0 < int(maxconn[0]) <= 65536
    # each frontend a share of its own, together no more than the process's: no one port starves the others
    shares = {name: lines(section, "maxconn") for (kind, name), section in haproxy.items() if kind == "frontend"}
    assert all(len(share) == 1 for share in shares.values()), shares
    assert sum(int(share[0][0]) for share in shares.values()) <= int(maxconn[0])
    timeouts = {t[0]: duration_seconds(t[1]) for t in lines(haproxy[("defaults", "")], "timeout")}
    settings = settings_from({}, monkeypatch)
    assert timeouts["http-request"] <= settings.body_timeout_s
    assert timeouts["http-request"] == settings.header_timeout_s  # as a replica reached directly
    assert timeouts["server"] >= settings.max_request_timeout_s
    assert {"connect", "client", "http-keep-alive", "check"} <= set(timeouts)


def test_haproxy_answers_its_own_errors_in_the_services_format(haproxy):
    """HAProxy's own 408, 502, 503 and 504 are JSON errors with codes the service uses, 503 with
    ``Retry-After``, so that clients read them as they read the service's."""
    from service.errors import ServiceError

    codes = {cls.code for cls in _subclasses(ServiceError)} | {"not_ready"}  # /readyz's
    found = {}
    for section in haproxy.values():
        for line in lines(section, "http-error"):
            status = int(line[1])
            assert line[2:4] == ["content-type", "application/json"] and line[4] == "string", line
            error = json.loads(line[5])["error"]
            assert error["code"] in codes and error["message"], error
            found[status] = line[6:]
    assert set(found) == {408, 502, 503, 504}
    assert found[503] == ["hdr", "Retry-After", "1"]


def _subclasses(cls: type) -> list[type]:
    return [cls, *(s for c in cls.__subclasses__() for s in _subclasses(c))]
