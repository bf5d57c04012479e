"""A private Docker engine for the container tests, and the stand-in base images they build from.

The engine is Debian's dockerd (package docker.io), started by the tests as root with its data, state
and socket under a temporary folder, and stopped (every container removed, the folder deleted) after.
It creates no bridge and no NAT rules (``--bridge=none --iptables=false ...``): every container uses
the host's network, and the tests send traffic to 127.0.0.1 only.

No image registry is reachable, so the bases the Dockerfile and the Compose file name are stand-ins
made from Debian packages with mmdebstrap and tagged under those names: a Debian Python for
``python:3.11-slim-bookworm``, the same with ``CUDA_VERSION`` set for the CUDA runtime image, Debian's
redis-server, prometheus and haproxy for ``redis``, ``prom/prometheus`` and ``haproxy``. The root file
systems are cached as tarballs in ~/.cache/attnserve/docker (``ATTNSERVE_DOCKER_CACHE``), keyed by what
goes into them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from tests.ci import missing

CACHE = Path(os.environ.get("ATTNSERVE_DOCKER_CACHE", Path.home() / ".cache" / "attnserve" / "docker"))
SUITE = "bookworm"  # the Debian release of the project's images
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")  # pip inside a build trusts what the host trusts
# what Debian's slim images leave out too
SLIM = [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "info", "locale")]


def missing_requirements() -> str | None:
    """Why the engine cannot run here, or None."""
    if os.geteuid() != 0:
        return "dockerd runs as root only"
    for command, package in [
        ("dockerd", "docker.io"),
        ("mmdebstrap", "mmdebstrap"),
        ("docker-compose", "docker-compose"),
    ]:
        if shutil.which(command) is None:
            return f"{command} is not installed (make system-deps installs Debian's {package})"
    return None


@dataclass
class Engine:
    folder: Path
    process: subprocess.Popen
    client: str  # the docker CLI of the same package as dockerd

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": f"unix://{self.folder}/docker.sock", "DOCKER_CONFIG": str(self.folder)}

    def docker(self, *args: str, timeout: float = 120, check: bool = True, **env: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [self.client, *args],
            env={**self.env, "DOCKER_BUILDKIT": "0", **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"docker {' '.join(args[:3])} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
            )
        return proc

    def inspect(self, kind: str, name: str) -> dict:
        return json.loads(self.docker(kind, "inspect", name).stdout)[0]

    def stop(self) -> None:
        ids = self.docker("ps", "-aq", check=False).stdout.split()
        if ids:
            self.docker("rm", "-f", "-v", *ids, check=False, timeout=60)
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        # what dockerd left mounted there (its network namespace file, a layer after a crash)
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(f"{self.folder}/")), reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        shutil.rmtree(self.folder, ignore_errors=True)


def start_engine(folder: Path) -> Engine:
    dockerd = shutil.which("dockerd")
    client = str(Path(dockerd).resolve().parent.parent / "bin" / "docker")
    command = [
        dockerd,
        "--bridge=none",
        "--iptables=false",
        "--ip6tables=false",
        "--ip-masq=false",
        f"--data-root={folder}/data",
        f"--exec-root={folder}/exec",
        f"--host=unix://{folder}/docker.sock",
        f"--pidfile={folder}/docker.pid",
        "--log-level=warn",
    ]
    log = (folder / "dockerd.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    engine = Engine(folder, process, client)
    deadline = time.monotonic() + 60
    while engine.docker("version", check=False, timeout=10).returncode != 0:
        if process.poll() is not None or time.monotonic() > deadline:
            engine.stop() if process.poll() is None else None
            raise AssertionError(f"dockerd did not start:\n{(folder / 'dockerd.log').read_text()[-3000:]}")
        time.sleep(0.5)
    return engine


def rootfs(name: str, packages: list[str], hooks: list[str] = ()) -> Path:
    """A Debian root file system with ``packages`` as a tarball, made once and cached."""
    args = ["--variant=minbase", f"--include={','.join(packages)}", *SLIM, *hooks, SUITE]
    key = hashlib.sha256(json.dumps(args).encode()).hexdigest()[:12]
    tarball = CACHE / f"{name}-{key}.tar"
    if not tarball.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = tarball.with_suffix(".partial.tar")  # mmdebstrap writes the format the name ends in
        proc = subprocess.run(
            ["mmdebstrap", "--quiet", *args, str(partial)], check=False, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"mmdebstrap {name}: {proc.stderr[-3000:]}"
        for old in set(CACHE.glob(f"{name}-*.tar")) - {partial}:
            old.unlink()
        partial.rename(tarball)
    return tarball


def import_rootfs(engine: Engine, tarball: Path, tag: str, *changes: str) -> None:
    engine.docker("import", *[a for c in changes for a in ("--change", c)], str(tarball), tag, timeout=300)


def build_inline(engine: Engine, tag: str, dockerfile: str, files: dict[str, Path] = {}) -> None:  # noqa: B006
    """Build a small image from ``dockerfile`` text with ``files`` as its context."""
    context = engine.folder / "context" / re.sub(r"\W", "-", tag)
    context.mkdir(parents=True)
    for name, source in files.items():
        shutil.copyfile(source, context / name)
    (context / "Dockerfile").write_text(dockerfile)
    engine.docker("build", "-q", "-t", tag, str(context), timeout=120)


def make_stand_ins(engine: Engine, python_image: str, cuda_image: str, redis_image: str, prometheus_image: str) -> None:
    """Tag stand-ins for the four public images the project's Dockerfile and Compose file name."""
    python = rootfs("python", ["python3", "python3-venv", "python-is-python3", "ca-certificates"])
    import_rootfs(engine, python, "attnserve-test/debian-python", 'CMD ["python3"]')
    pip_ca = ""
    if HOST_CA.exists():  # a thin test-only layer: the host's CA bundle for pip, never in the project's Dockerfile
        pip_ca = "COPY host-ca.crt /etc/ssl/host-ca.crt\nENV PIP_CERT=/etc/ssl/host-ca.crt\n"
    files = {"host-ca.crt": HOST_CA} if pip_ca else {}
    build_inline(engine, python_image, f"FROM attnserve-test/debian-python\n{pip_ca}", files)
    cuda = re.search(r":(\d+\.\d+\.\d+)", cuda_image)[1]  # nvidia/cuda:13.0.1-... sets CUDA_VERSION=13.0.1
    build_inline(engine, cuda_image, f"FROM {python_image}\nENV CUDA_VERSION={cuda} NVIDIA_VISIBLE_DEVICES=all\n")
    redis = rootfs("redis", ["redis-server"])
    import_rootfs(engine, redis, redis_image, 'CMD ["redis-server", "--protected-mode", "no"]', "EXPOSE 6379")
    owned = 'mkdir -p "$1/prometheus" && chown 65534:65534 "$1/prometheus"'
    prometheus = rootfs("prometheus", ["prometheus"], [f"--customize-hook={owned}"])
    import_rootfs(
        engine,
        prometheus,
        prometheus_image,
        'ENTRYPOINT ["/usr/bin/prometheus"]',
        'CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]',
        "USER nobody",
        "WORKDIR /prometheus",
        "EXPOSE 9090",
    )


def make_haproxy_stand_in(engine: Engine, image: str) -> None:
    """Debian's haproxy tagged as ``image``, laid out as the official image is: the configuration in
    /usr/local/etc/haproxy/haproxy.cfg, run in the foreground as the user haproxy, SIGUSR1 (a soft stop:
    connections in flight finish) as its stop signal. ``docker import`` takes no STOPSIGNAL, hence the
    layer built on it."""
    haproxy = rootfs("haproxy", ["haproxy"])
    import_rootfs(engine, haproxy, "attnserve-test/debian-haproxy")
    build_inline(
        engine,
        image,
        "FROM attnserve-test/debian-haproxy\nUSER haproxy\nSTOPSIGNAL SIGUSR1\n"
        'CMD ["haproxy", "-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]\n',
    )


def wait_ready(url: str, timeout: float, alive=lambda: True) -> float:
    """Seconds until GET {url}/readyz answered 200."""
    started = time.monotonic()
    while time.monotonic() - started < timeout and alive():
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url}/readyz did not answer 200 within {timeout} s")


def host_network_variant(config: dict) -> tuple[dict, dict[str, str]]:
    """The resolved Compose file with every service on the host's network, each service name (and
    network alias) resolving to its own loopback address; nothing else changes."""
    services = config["services"]
    names = {}
    for name, service in services.items():
        for alias in [name, *((service.get("networks") or {}).get("default") or {}).get("aliases", [])]:
            names.setdefault(alias, f"127.0.0.{len(names) + 2}")
    for service in services.values():
        service.pop("networks", None)
        service.pop("ports", None)  # published ports mean nothing on the host's network
        service["network_mode"] = "host"
        service["extra_hosts"] = [f"{alias}:{address}" for alias, address in names.items()]
    config.pop("networks", None)
    return config, names


@contextmanager
def engine_with_stand_ins(folder: Path, figures: dict) -> Iterator[tuple[Engine, dict]]:
    """A private engine holding the stand-in bases the Dockerfile and docker-compose.yml name, and the Compose
    services; skipped where a part is missing, failed in CI (root, ``make install-dev``: nothing may be missing)."""
    from tests.deploy.parsing import ROOT, parse_dockerfile

    why = missing_requirements()
    if why:
        missing(why)
    engine = start_engine(folder)
    try:
        args = parse_dockerfile().args
        services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
        started = time.monotonic()
        images = [services[s]["image"] for s in ("redis", "prometheus")]
        make_stand_ins(engine, args["PYTHON_IMAGE"], args["CUDA_IMAGE"], *images)
        figures["stand-in bases (s)"] = round(time.monotonic() - started, 1)
        yield engine, services
    finally:
        engine.stop()
