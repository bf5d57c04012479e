"""The README's "Python client" examples run as written against the shipped models.

Each ``python`` block runs in a fresh interpreter, each ``attnserve-client`` line as a command, in a
folder holding ``shoe.png`` (the README's Fashion-MNIST test image), against the test server in
place of ``http://127.0.0.1:8000``.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.service.service_testing import ROOT

README_URL = "http://127.0.0.1:8000"


def section_blocks(language: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Python client\n")
    section = text[start : text.index("\n## ", start + 1)]
    return [code for lang, code in re.findall(r"```(\w*)\n(.*?)```", section, re.DOTALL) if lang == language]


COMMANDS = [
    line for block in section_blocks("bash") for line in block.splitlines() if line.startswith("attnserve-client")
]


@pytest.fixture
def workdir(tmp_path, shoe):
    shutil.copy(shoe, tmp_path / "shoe.png")
    return tmp_path


def run(argv: list[str], workdir, server) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "ATTNSERVE_BASE_URL": server.url}
    return subprocess.run(argv, cwd=workdir, env=env, check=False, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("index", range(len(section_blocks("python"))))
def test_python_examples(index, workdir, server):
    code = section_blocks("python")[index].replace(README_URL, server.url)
    proc = run([sys.executable, "-c", code], workdir, server)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()


@pytest.mark.parametrize("command", COMMANDS)
def test_command_line_examples(command, workdir, server):
    args = shlex.split(command.replace(README_URL, server.url))[1:]
    proc = run([sys.executable, "-m", "attnserve_client", *args], workdir, server)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()


def test_the_section_has_examples():
    assert len(section_blocks("python")) >= 4 and len(COMMANDS) >= 6
