"""The web page (GET /) in a real headless browser: Debian's Chromium driven by Playwright.

A person's path through it: the page lists the models and shows no picture before there is one, a
sample image is classified and its heatmap drawn, another layer is picked, an uploaded image is
classified, a heatmap that cannot be loaded is hidden, a sentence is translated and its alignment
drawn. No visible ``<img>`` is ever broken (the browser's broken-image icon). Screenshots go to
``test-artifacts/`` for a person to look at.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from service.attention import render
from tests.conftest import ROOT, run_module
from tests.service.service_testing import serving

ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def repository(both_repository, tiny_translation_data, tmp_path_factory):
    """The tiny models, the translator's manifest also recording an evaluation on other data, as
    ``export.evaluate --record heldout`` writes the held-out system catalogs' one."""
    repo = tmp_path_factory.mktemp("web-models") / "models"
    shutil.copytree(both_repository, repo)
    entry = repo / "translator" / "1"
    proc = run_module(
        "export.evaluate", "--entry", str(entry), "--data", str(tiny_translation_data), "--record", "heldout"
    )
    assert proc.returncode == 0, proc.stderr
    return repo


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    with serving(tmp_path_factory.mktemp("web"), repository) as srv:
        yield srv


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright

    assert CHROMIUM, "chromium is not installed: run `make system-deps`"
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        page.errors = []
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        page.goto(server.url + "/")
        yield page
        browser.close()


def loaded_width(page, selector: str) -> int:
    """Wait until the <img> has loaded its current src; its natural width."""
    return page.wait_for_function(
        "s => { const i = document.querySelector(s); return i.src && i.complete && i.naturalWidth > 0 && i.naturalWidth; }",
        arg=selector,
        timeout=30_000,
    ).json_value()  # the width of the image that was loaded when the wait ended, not of a later one


def broken_images(page) -> list[str]:
    """The alt text (else src) of every visible <img> without a loaded picture: empty, failed or still loading."""
    return page.evaluate(
        "() => [...document.images].filter(i => i.checkVisibility() && !(i.complete && i.naturalWidth > 0))"
        ".map(i => i.alt || i.src || '(no alt, no src)')"
    )


def test_before_any_request_the_page_shows_no_picture_it_does_not_have(page, server):
    """A tab of its own, as a person first sees the page: the sample images, and no empty heatmap or alignment."""
    fresh = page.context.browser.new_page(viewport={"width": 1200, "height": 1000})
    try:
        fresh.goto(server.url + "/")
        fresh.wait_for_function("document.getElementById('status').textContent === 'Ready.'")
        fresh.wait_for_function(  # the sample pictures, once loaded, are the only pictures on show
            "() => [...document.querySelectorAll('#samples img')].every(i => i.checkVisibility()"
            " && i.complete && i.naturalWidth > 0)"
        )
        assert broken_images(fresh) == []
        assert not fresh.is_visible("#vit-heatmap") and not fresh.is_visible("#alignment")
        assert not fresh.is_visible("#classify-result") and not fresh.is_visible("#translate-result")
        fresh.screenshot(path=str(ARTIFACTS / "web-first-load.png"), full_page=True)
    finally:
        fresh.close()


def test_a_sample_image_is_classified_with_its_heatmap(page, server):
    page.wait_for_selector("#samples button")
    assert "vit v1" in page.inner_text("#models") and "CPUExecutionProvider" in page.inner_text("#models")
    samples = httpx.get(server.url + "/samples").json()["images"]
    assert page.locator("#samples button").count() == len(samples) == 10
    page.click("#samples button >> nth=9")
    page.wait_for_selector("#topk li")
    labels = [t.strip() for t in page.locator("#topk .label").all_inner_texts()]
    png = httpx.get(server.url + samples[9]["url"]).content
    import base64

    api = httpx.post(server.url + "/classify", json={"images": [base64.b64encode(png).decode()]}).json()
    assert labels == [t["label"] for t in api["results"][0]["top_k"]]
    assert loaded_width(page, "#vit-heatmap") == render.VIT_SIZE[0]
    rollout_src = page.get_attribute("#vit-heatmap", "src")
    page.select_option("#vit-kind", "attention")
    page.select_option("#vit-head", "1")
    page.wait_for_function(f"document.getElementById('vit-heatmap').getAttribute('src') !== {rollout_src!r}")
    assert "layer=" in page.get_attribute("#vit-heatmap", "src") and "head=1" in page.get_attribute(
        "#vit-heatmap", "src"
    )
    assert loaded_width(page, "#vit-heatmap") == render.VIT_SIZE[0]
    assert page.is_visible("#vit-heatmap") and broken_images(page) == []
    page.screenshot(path=str(ARTIFACTS / "web-classify.png"), full_page=True)
    assert not page.errors


def test_an_uploaded_image_is_classified(page, fashion_pngs, tmp_path):
    path = Path(tmp_path) / "mine.png"
    path.write_bytes(fashion_pngs[0])
    before = page.get_attribute("#vit-heatmap", "src")
    page.set_input_files("#upload", str(path))
    page.wait_for_function(f"document.getElementById('vit-heatmap').getAttribute('src') !== {before!r}")
    assert loaded_width(page, "#vit-heatmap") == render.VIT_SIZE[0]
    assert page.locator("#topk li").count() == 5 and "error" not in (page.get_attribute("#status", "class") or "")
    assert page.is_visible("#vit-heatmap") and broken_images(page) == []


def test_a_heatmap_that_cannot_be_loaded_is_hidden_not_broken(page):
    """The page asks for the heatmap of an attention id the service does not know (as when its id has
    expired): the service answers 404, and the page hides the picture and says so instead."""
    page.evaluate("state.vitId = 'no-such-attention-id'")  # the page script's own state: a global binding
    page.select_option("#vit-kind", "rollout")
    page.wait_for_selector("#status.error")
    assert "could not load" in page.inner_text("#status").lower()
    page.wait_for_selector("#vit-heatmap", state="hidden")
    assert broken_images(page) == []


def test_a_sentence_is_translated_with_its_alignment(page, server):
    text = "Open the dialog."
    page.fill("#text", text)
    page.select_option("#beam", "4")
    page.click("#translate-form button[type=submit]")
    page.wait_for_function("document.getElementById('translation').textContent.length > 0")
    api = httpx.post(server.url + "/translate", json={"text": text, "beam_size": 4, "return_attention": True}).json()
    result = api["results"][0]
    assert page.inner_text("#translation") == result["translation"]
    rows, cols = len(result["attention"]["target_tokens"]), len(result["source_tokens"])
    assert loaded_width(page, "#alignment") == render.grid_size(rows, cols)[0]
    page.select_option("#tr-kind", "encoder")
    page.wait_for_function("document.getElementById('alignment').src.includes('kind=encoder')")
    assert loaded_width(page, "#alignment") == render.grid_size(cols, cols)[0]
    assert page.is_visible("#alignment") and broken_images(page) == []
    page.screenshot(path=str(ARTIFACTS / "web-translate.png"), full_page=True)
    assert not page.errors


def test_the_page_shows_what_was_protected_and_how_the_text_was_split(page, server):
    text = "Could not open %s. Deleted %d files."
    page.fill("#text", text)
    page.click("#translate-form button[type=submit]")
    page.wait_for_function("!document.getElementById('placeholders').hidden")
    beam = int(page.eval_on_selector("#beam", "e => e.value"))
    result = httpx.post(server.url + "/translate", json={"text": text, "beam_size": beam}).json()["results"][0]
    assert [p["text"] for p in result["placeholders"]] == ["%s", "%d"]
    assert page.inner_text("#translation") == result["translation"]
    assert page.locator("#placeholders li").all_inner_texts() == ["%s ✓", "%d ✓"]
    cut = sum(not s["finished"] for s in result["sentences"])  # the tiny model may run to its length limit
    note = "2 sentences, translated as one batch." + (f" {cut} cut at the length limit (max_new_tokens)." * (cut > 0))
    assert page.inner_text("#sentence-note") == note
    page.screenshot(path=str(ARTIFACTS / "web-placeholders.png"), full_page=True)
    assert not page.errors


def test_the_translator_says_what_it_is_for_and_marks_its_samples(page, server):
    models = httpx.get(server.url + "/models").json()["models"]
    domains = next(m for m in models if m["task"] == "translation")["evaluation"]["domains"]
    note = page.inner_text("#translator-note")
    assert note.startswith("Trained on") and "Test BLEU (beam 4)" in note
    assert f"help pages {domains['help']['beam4']['bleu']:.1f}" in note
    assert f"everyday sentences {domains['everyday']['beam4']['bleu']:.1f}" in note
    heldout = next(m for m in models if m["task"] == "translation")["evaluation"]["heldout"]["beam4"]["bleu"]
    assert f"Messages of software it never saw: BLEU {heldout:.1f}." in note  # the recorded held-out score
    texts = httpx.get(server.url + "/samples").json()["texts"]
    chips = page.locator("#sentences button")
    assert chips.count() == len(texts) > 0 and all(t["quality"] in ("good", "fair", "poor") for t in texts)
    for i, t in enumerate(texts):
        mark = {"good": "✓ ", "poor": "✗ "}.get(t["quality"], "")
        assert chips.nth(i).inner_text() == mark + t["text"]
        assert t["quality"] in chips.nth(i).get_attribute("class") and t["reference"] in chips.nth(i).get_attribute(
            "title"
        )
    assert not page.errors


def test_with_api_keys_the_page_asks_for_one_and_then_works(page, tmp_path):
    """The service requires a key: the page shows its key form, and with the key it lists the models,
    shows the sample images and classifies one, its heatmap fetched with the key."""
    from service.core.keys import hash_key

    key = "web-page-key-31c9"
    with serving(tmp_path, ROOT / "models", api_key_hashes=f'["{hash_key(key)}"]') as srv:
        keyed = page.context.browser.new_page()  # a new tab of the module's browser: its own sessionStorage
        errors: list[str] = []
        keyed.on("pageerror", lambda e: errors.append(str(e)))
        keyed.goto(srv.url + "/")
        keyed.wait_for_selector("#key-form:not([hidden])")
        assert "API key" in keyed.inner_text("#status")
        keyed.fill("#key", key)
        keyed.click("#key-form button")
        keyed.wait_for_selector("#samples button")
        assert "vit v1" in keyed.inner_text("#models")
        assert keyed.evaluate("sessionStorage.getItem('attnserve-key')") == key
        keyed.click("#samples button >> nth=0")
        keyed.wait_for_selector("#topk li")
        assert loaded_width(keyed, "#vit-heatmap") == render.VIT_SIZE[0]
        assert keyed.get_attribute("#vit-heatmap", "src").startswith("blob:")
        keyed.close()
    assert not errors


REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"  # ReDoc's own footer logo: blocked, nothing else needs it


@pytest.mark.parametrize(
    ("path", "rendered", "asked_outside"),
    [
        ("/docs", ".swagger-ui .opblock", []),
        ("/redoc", "h2:has-text('Classify one or more images')", [REDOC_LOGO]),
    ],
)
def test_the_api_docs_render_with_every_outside_request_blocked(page, server, path, rendered, asked_outside):
    """As on an air-gapped cluster: the page and everything it needs come from the service itself."""
    offline = page.context.browser.new_page()
    outside: list[str] = []

    def only_the_service(route) -> None:
        if route.request.url.startswith(server.url):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    offline.route("**/*", only_the_service)
    offline.goto(server.url + path)
    offline.wait_for_selector(rendered, timeout=30_000)
    assert "classify" in offline.inner_text("body").lower()
    offline.close()
    assert sorted(set(outside)) == asked_outside  # no script, style or font from a CDN
