"""docker-compose.yml: parsed by a real Compose implementation, and checked against the Dockerfile,
the service's settings and routes, and the files it mounts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from urllib.parse import urlparse

import pytest
import yaml

from tests.conftest import SHIPPED_TRANSLATOR
from tests.deploy.parsing import (
    ROOT,
    attnserve_env,
    drain_seconds,
    duration_seconds,
    exec_form,
    parse_dockerfile,
    route_paths,
    settings_fields,
    settings_from,
)

COMPOSE_FILE = ROOT / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())  # PyYAML resolves the `<<` merge keys as Compose does


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def docker_compose(*args: str, file=COMPOSE_FILE) -> subprocess.CompletedProcess:
    exe = shutil.which("docker-compose")
    if exe is None:
        if os.environ.get("CI"):  # `make install-dev` installs it (SYSTEM_DEPS): missing under CI is a failure
            pytest.fail("docker-compose is not installed")
        pytest.skip("docker-compose is not installed (make system-deps installs Debian's docker-compose)")
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
    assert set(resolved) == {"api", "api-cpu", "redis", "prometheus"}
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


@pytest.mark.parametrize("name", ["api", "api-cpu"])
def test_api_healthcheck_restart_and_drain(services, name):
    s = services[name]
    dockerfile = parse_dockerfile()
    (hc,) = dockerfile.stage(s["build"]["target"]).all("HEALTHCHECK")
    assert s["healthcheck"]["test"] == ["CMD", *exec_form(hc.args.split(" CMD ", 1)[1])]
    assert "/readyz" in s["healthcheck"]["test"][-1] and "/readyz" in route_paths()
    assert s["restart"] in {"always", "unless-stopped", "on-failure"}
    assert duration_seconds(s["stop_grace_period"]) > drain_seconds(), "Docker would kill the service mid-drain"
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
