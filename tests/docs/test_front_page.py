"""The README is a short front page: the two commands first, every link resolving, every docs page one click away."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest

from tests.docs.markdown import DOCS, README, anchors, blocks, links, pages
from tests.service.service_testing import ROOT

MAX_LINES = 300

# What a user asks first, and where the README sends them (one click each).
QUESTIONS = {
    "how do I set the batch size?": "docs/configuration.md#batching",
    "what does it cost to ask for attention?": "docs/attention.md#what-it-costs",
    "how do I add a model version?": "docs/model-repository.md#adding-a-model-version",
    "what are the error codes?": "docs/api.md#errors",
    "how do I run on a GPU?": "docs/deployment.md#gpu",
}


def relative_links() -> list[str]:
    return [t for t in links(README) if not urlsplit(t).scheme and not t.startswith("#")]


def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines: move the detail into docs/"


def test_the_readme_starts_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    first = blocks(README)[0]
    assert text.startswith("# attnserve\n\n```bash\n") and first.lang == "bash"
    serve, test = first.code.splitlines()
    assert serve.startswith("make serve ") and test.startswith("make test ")
    # `make test` says what it installs: everything the Makefile installs for the tests.
    makefile = (ROOT / "Makefile").read_text()
    packages = re.search(r"^SYSTEM_DEPS := (.*)$", makefile, re.MULTILINE).group(1).split()
    for package in ["Fashion-MNIST", *(dep.split(":")[1] for dep in packages)]:
        assert package in test, f"the README's `make test` line does not say it installs {package}"


@pytest.mark.parametrize("target", relative_links())
def test_readme_links_resolve(target):
    path, _, anchor = target.partition("#")
    file = ROOT / path
    assert file.exists(), f"README.md links to {path}, which does not exist"
    if anchor:
        assert file.suffix == ".md" and anchor in anchors(file), f"{path} has no heading #{anchor}"


def test_readme_anchors_resolve():
    own = [t.removeprefix("#") for t in links(README) if t.startswith("#")]
    assert own and sorted(set(own) - anchors(README)) == []


def test_every_docs_page_is_one_click_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links()}
    assert sorted(str(p.relative_to(ROOT)) for p in pages() if p.resolve() not in linked) == []


@pytest.mark.parametrize("question", QUESTIONS)
def test_what_users_ask_is_one_click_away(question):
    target = QUESTIONS[question]
    assert target in relative_links(), f"README.md does not link {target} ({question})"
    path, anchor = target.split("#")
    assert anchor in anchors(ROOT / path)


def test_the_images_are_small():
    images = [p for p in DOCS.rglob("*") if p.suffix.lower() in {".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp"}]
    assert images and all(p.stat().st_size < 200_000 for p in images), {p.name: p.stat().st_size for p in images}
