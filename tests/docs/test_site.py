"""The docs site builds with ``mkdocs build --strict``, and every docs page the code points readers to exists.

``--strict`` turns MkDocs' warnings into a failure: a link to a page or an anchor that does not
exist, a page left out of the navigation (mkdocs.yml sets every ``validation`` check to ``warn``).
The theme loads no web fonts and no plugin fetches anything, so the build runs offline.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.docs.markdown import DOCS, pages
from tests.service.service_testing import ROOT

CODE_PACKAGES = ("model", "export", "service", "contract", "benchmarks", "client", "deploy")
DOCS_PATH = re.compile(r"\bdocs/[\w./-]+\.md\b")


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_site_builds_strictly(tmp_path):
    proc = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    for page in pages():
        stem = page.relative_to(DOCS).with_suffix("").as_posix()
        assert ("index.html" if stem == "index" else f"{stem}/index.html") in built, page


@pytest.mark.parametrize(
    "breakage",
    [
        "[a page that does not exist](no-such-page.md)",
        "[an anchor that does not exist](api.md#no-such-heading)",
    ],
)
def test_a_broken_link_fails_the_build(tmp_path, breakage):
    """The check above can fail: the same site with one broken link does not build."""
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text(encoding="utf-8") + f"\n{breakage}\n", encoding="utf-8")
    proc = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0
    assert "index.md" in proc.stdout + proc.stderr


def test_every_page_is_in_the_navigation():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)

    def listed(nav) -> set[str]:
        if isinstance(nav, str):
            return {nav}
        items = nav.values() if isinstance(nav, dict) else nav
        return set().union(*(listed(item) for item in items))

    assert listed(config["nav"]) == {p.relative_to(DOCS).as_posix() for p in pages()}


def test_the_site_needs_no_network():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    assert config["theme"]["font"] == "false"  # Material would load Google Fonts
    plugins = {p if isinstance(p, str) else next(iter(p)) for p in config.get("plugins", [])}
    assert plugins <= {"search"}, plugins  # social cards and the privacy plugin fetch from the network


def code_files() -> list[Path]:
    return sorted(p for package in CODE_PACKAGES for p in (ROOT / package).rglob("*.py"))


def test_docs_pages_named_in_the_code_exist():
    named = {
        (str(path.relative_to(ROOT)), ref)
        for path in code_files()
        for ref in DOCS_PATH.findall(path.read_text(encoding="utf-8"))
    }
    missing = sorted((where, ref) for where, ref in named if not (ROOT / ref).is_file())
    assert missing == []
