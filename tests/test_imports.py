"""The import rules that keep the packages' roles apart, checked on every import statement (lazy ones too).

- ``contract`` is what the others agree on: it imports none of them, and no torch;
- ``model`` (training) and ``export`` use the contract, never the server; ``model`` never the exporter;
- ``service`` never imports torch, ``model`` or ``export`` (tests/service/test_no_torch.py checks the
  same at run time), nor ``tritonclient``, a client library it is tested with;
- the client SDK is installed on its own and imports nothing of this repository.
"""

from __future__ import annotations

import ast
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
