"""The import rules that keep the packages' roles apart, checked on every import statement (lazy ones too).

- ``contract`` is what the others agree on: it imports none of them, and no torch;
- ``model`` (training) and ``export`` use the contract, never the server; ``model`` never the exporter;
- ``service`` never imports torch, ``model`` or ``export`` (tests/service/test_no_torch.py checks the
  same at run time), nor ``tritonclient``, a client library it is tested with;
- the client SDK is installed on its own and imports nothing of this repository;
- inside ``service``, HTTP (``service/http/``) and gRPC (``service/grpc/``) are peer transports over
  one core: neither imports the other, the core (every other module but the process composition,
  ``service/__main__.py`` and ``service/process.py``) imports neither, and a process that serves
  gRPC alone loads no HTTP framework (checked at run time); a transport reaches the engines
  (``service/engine/``) only through the core's operations.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPOSITORY_PACKAGES = {"contract", "model", "export", "service", "benchmarks", "deploy", "tests", "attnserve_client"}

FORBIDDEN = {
    "contract": {"model", "export", "service", "torch", "onnx", "benchmarks"},
    "model": {"service", "export"},
    "export": {"service"},
    "service": {"torch", "model", "export", "onnx", "transformers", "benchmarks", "tritonclient"},
    "client": REPOSITORY_PACKAGES - {"attnserve_client"},
}


def imported_roots(path: Path) -> set[str]:
    """The top-level names every ``import``/``from ... import`` in a file reaches (relative imports excluded)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_nothing_it_must_not(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    broken = {str(f.relative_to(ROOT)): sorted(bad) for f in files if (bad := imported_roots(f) & FORBIDDEN[package])}
    assert broken == {}


def test_the_checker_sees_lazy_and_from_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os.path\n\ndef f():\n    from service.http.app import create_app\n    import torch.nn as nn\n"
    )
    assert imported_roots(probe) == {"os", "service", "torch"}


TRANSPORTS = ("service.http", "service.grpc")
COMPOSITION = ("service/__main__.py", "service/process.py")  # where the core and both transports meet


def imported_modules(path: Path) -> set[str]:
    """The dotted names every ``import``/``from ... import`` in a file reaches, each name a ``from`` import
    takes included (``from service import http`` reaches ``service.http``); relative imports excluded."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def reaching(path: Path, packages: tuple[str, ...]) -> list[str]:
    """The modules of ``packages`` (or the packages themselves) that ``path`` imports."""
    return sorted(m for m in imported_modules(path) if any(m == p or m.startswith(p + ".") for p in packages))


def modules_under(package: str) -> list[Path]:
    return sorted((ROOT / package.replace(".", "/")).rglob("*.py"))


@pytest.mark.parametrize(("transport", "peer"), [TRANSPORTS, TRANSPORTS[::-1]])
def test_a_transport_never_imports_the_other(transport, peer):
    files = modules_under(transport)
    assert files, f"no Python files under {transport}"
    broken = {str(f.relative_to(ROOT)): bad for f in files if (bad := reaching(f, (peer,)))}
    assert broken == {}


def test_the_core_imports_neither_transport():
    transports = tuple(ROOT / t.replace(".", "/") for t in TRANSPORTS)
    core = [
        f
        for f in modules_under("service")
        if not f.is_relative_to(transports[0])
        and not f.is_relative_to(transports[1])
        and str(f.relative_to(ROOT)) not in COMPOSITION
    ]
    assert "service/registry.py" in {str(f.relative_to(ROOT)) for f in core}
    broken = {str(f.relative_to(ROOT)): bad for f in core if (bad := reaching(f, TRANSPORTS))}
    assert broken == {}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_transport_reaches_the_engines_only_through_the_core(transport):
    broken = {
        str(f.relative_to(ROOT)): bad for f in modules_under(transport) if (bad := reaching(f, ("service.engine",)))
    }
    assert broken == {}


def test_the_grpc_server_loads_no_http_framework():
    """Imports are transitive: the rules above keep ``service.http`` out; this keeps FastAPI and Starlette out."""
    probe = (
        "import json, sys; import service.grpc.server; "
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('fastapi', 'starlette') or m.startswith('service.http'))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_the_checker_sees_submodules_taken_by_name(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from service import http\n\ndef f():\n    from service.grpc.server import start\n")
    assert reaching(probe, ("service.http",)) == ["service.http"]
    assert reaching(probe, ("service.grpc",)) == ["service.grpc.server", "service.grpc.server.start"]
