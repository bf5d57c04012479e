"""The SDK installs alone, from PyPI, into a fresh virtual environment: httpx, pydantic and polib, nothing else.

Users install the client on machines that will never run a model: it must not pull in onnxruntime,
torch or numpy, and must work there (a real call to the service through the installed command).
"""

from __future__ import annotations

import shutil
import subprocess
import venv

from tests.service.service_testing import ROOT


def test_the_sdk_installs_and_runs_without_the_service_dependencies(tmp_path, server):
    source = shutil.copytree(ROOT / "client", tmp_path / "client", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(source)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr

    probe = (
        "import importlib.util, attnserve_client; "
        "print(sorted(m for m in ('onnxruntime', 'torch', 'numpy', 'PIL', 'fastapi') if importlib.util.find_spec(m)))"
    )
    found = subprocess.run([python, "-c", probe], check=False, capture_output=True, text=True, timeout=60)
    assert (found.returncode, found.stdout) == (0, "[]\n"), found.stderr

    translate = subprocess.run(
        [env_dir / "bin" / "attnserve-client", "translate", "Open the file.", "--base-url", server.url],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert translate.returncode == 0 and translate.stdout.strip(), translate.stderr
