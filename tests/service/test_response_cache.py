"""The response cache's keys, its report, and what it does when Redis is not there (no server needed).

What a user relies on: an answer is never served for another model file, another option or another
text or image; the same request always finds its entry; and a Redis that is down costs a request
nothing but the lookup it failed (counted, logged once, not retried for a second).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import time

import numpy as np
import pytest
import redis as redis_py

from service import build
from service.core import response_cache
from service.core.response_cache import (
    CacheReport,
    ImageOptions,
    Keys,
    ModelIdentity,
    ResponseCache,
    TranslationOptions,
    decode_translation,
    encode_probabilities,
    encode_translation,
    probabilities_decoder,
)
from service.metrics import Metrics
from tests.conftest import ROOT
from tests.service.service_testing import free_port

MODEL = ModelIdentity("translator", "3", "fp32", "a" * 64, "CPUExecutionProvider")
OPTIONS = TranslationOptions(
    protect_placeholders=True,
    format="text",
    beam_size=4,
    length_penalty=1.0,
    num_return_sequences=1,
    max_new_tokens=None,
    max_new_tokens_cap=256,
)
TEXT = "Saves the current document."


def key(model=MODEL, options=OPTIONS, owner=None, text=TEXT) -> str:
    return Keys("translate", model, options, owner).text(text)


def test_the_same_request_has_the_same_key_and_it_names_its_operation():
    assert key() == key() == Keys("translate", MODEL, dataclasses.replace(OPTIONS), None).text(TEXT)
    assert key().startswith("attnserve:response:translate:") and len(key().rsplit(":", 1)[1]) == 64


@pytest.mark.parametrize(
    "change",
    [
        {"protect_placeholders": False},
        {"format": "html"},
        {"beam_size": 1},
        {"length_penalty": 0.6},
        {"num_return_sequences": 2},
        {"max_new_tokens": 20},
        {"max_new_tokens_cap": 64},
    ],
    ids=lambda change: next(iter(change)),
)
def test_every_option_that_changes_a_translation_changes_its_key(change):
    assert key(options=dataclasses.replace(OPTIONS, **change)) != key()


def test_every_option_of_a_translation_is_in_its_key():
    """A new field of TranslationOptions must be part of the test above: the key covers every field."""
    assert {f.name for f in dataclasses.fields(TranslationOptions)} == {
        "protect_placeholders",
        "format",
        "beam_size",
        "length_penalty",
        "num_return_sequences",
        "max_new_tokens",
        "max_new_tokens_cap",
    }


@pytest.mark.parametrize(
    "change",
    [
        {"name": "translator-b"},
        {"version": "4"},
        {"precision": "int8"},
        {"files": "b" * 64},
        {"provider": "CUDAExecutionProvider"},
    ],
    ids=lambda change: next(iter(change)),
)
def test_another_model_file_version_precision_or_provider_is_another_key(change):
    assert key(model=dataclasses.replace(MODEL, **change)) != key()


def test_the_text_the_owner_the_build_and_the_format_are_in_the_key(monkeypatch):
    assert key(text=TEXT + " ") != key() and key(text="Öffnen") != key(text="Offnen")
    assert key(owner="fingerprint-a") != key() != key(owner="fingerprint-b") != key(owner="fingerprint-a")
    before = key()
    monkeypatch.setattr(response_cache, "FORMAT", response_cache.FORMAT + 1)
    assert key() != before
    monkeypatch.setattr(response_cache, "FORMAT", response_cache.FORMAT - 1)
    monkeypatch.setattr(response_cache, "identity", lambda: "0.1.0+another-build")
    assert key() != before


def test_the_build_is_the_version_and_a_digest_of_the_code_that_answers(tmp_path):
    """Two trees that differ in one byte of contract/ or service/ are two builds; the same tree is one."""
    for package in build.PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    assert build.code_digest(tmp_path) == build.code_digest(ROOT) and build.identity().startswith("0.1.0+")
    rule = tmp_path / "contract" / "sentences.py"
    rule.write_bytes(rule.read_bytes() + b"\n")
    assert build.code_digest(tmp_path) != build.code_digest(ROOT)


def test_operations_never_share_keys():
    pixels = np.zeros((1, 4), np.uint8)
    assert Keys("translate", MODEL, ImageOptions(False), None).pixels(pixels, False) != Keys(
        "classify", MODEL, ImageOptions(False), None
    ).pixels(pixels, False)


def test_an_images_key_is_its_pixels_dtype_shape_and_kind():
    keys = Keys("classify", MODEL, ImageOptions(shared_weights=False), None)
    rows = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28, 1)
    a, b = keys.pixels(rows, prepared=False)
    assert a != b and keys.pixels(rows[:1].copy(), prepared=False) == [a]  # per image, whatever its batch
    changed = rows[:1].copy()
    changed[0, 5, 5, 0] ^= 1
    assert keys.pixels(changed, prepared=False) != [a]  # one pixel
    assert keys.pixels(rows[:1].reshape(1, 28, 28), prepared=False) != [a]  # shape
    assert keys.pixels(rows[:1].astype(np.float32), prepared=False) != [a]  # dtype
    assert keys.pixels(rows[:1], prepared=True) != [a]  # the model's input, not decoded pixels
    other = Keys("classify", MODEL, ImageOptions(shared_weights=True), None)
    assert other.pixels(rows[:1], prepared=False) != [a]
    assert keys.pixels(np.asfortranarray(rows), prepared=False) == [a, b]  # the values count, not the memory layout


def test_what_an_entry_holds_comes_back_exactly():
    result = {"translation": "Öffnet „x“.", "nbest": [{"score": -0.1 / 3, "normalized_score": -1e-300}], "ok": True}
    assert decode_translation(encode_translation(result)) == result
    assert decode_translation(b"not json") is None and decode_translation(b"[1]") is None
    p = np.random.default_rng(0).dirichlet(np.ones(10))
    assert np.array_equal(probabilities_decoder(10)(encode_probabilities(p)), p)
    assert probabilities_decoder(11)(encode_probabilities(p)) is None


def test_the_report_becomes_the_x_cache_header():
    assert CacheReport().headers() == {}  # the cache is off
    report = CacheReport()
    report.bypassed()
    assert report.headers() == {"X-Cache": "bypass"}
    for found, outcome in (([1, 2], "hit"), ([None, None], "miss"), ([1, None], "partial")):
        report = CacheReport()
        report.looked_up(found, 2)
        hits = sum(f is not None for f in found)
        assert report.headers() == {"X-Cache": outcome, "X-Cache-Hits": f"{hits}/2"}
    report = CacheReport()
    report.looked_up(None, 2)
    assert report.headers() == {"X-Cache": "error"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def counted(metrics: Metrics) -> dict[tuple[str, ...], float]:
    out = {}
    for family in metrics.registry.collect():
        if family.name.startswith("attnserve_response_cache"):
            for s in family.samples:
                if s.name.endswith("_total"):
                    out[(s.name, *s.labels.values())] = s.value
    return out


def test_without_redis_every_lookup_is_an_error_counted_and_logged_once_a_minute(caplog):
    metrics, clock = Metrics(), Clock()
    cache = ResponseCache(
        f"redis://127.0.0.1:{free_port()}/0", 60, 0.3, 65536, observer=metrics.for_response_cache(), clock=clock
    )
    keys = [key(text=t) for t in ("a", "b", "c")]

    async def scenario() -> list:
        out = []
        out.append(await cache.get_many("translate", keys, decode_translation))  # refused: an error
        await cache.put_many("translate", {keys[0]: b"{}"})  # skipped: it failed less than a second ago
        clock.now += 0.5
        out.append(await cache.get_many("translate", keys[:1], decode_translation))  # not even tried
        clock.now += 1.0
        out.append(await cache.get_many("translate", keys[:2], decode_translation))  # tried again, refused again
        await cache.close()
        return out

    with caplog.at_level(logging.INFO, logger="attnserve.response_cache"):
        assert asyncio.run(scenario()) == [None, None, None]
    c = counted(metrics)
    assert c[("attnserve_response_cache_lookups_total", "translate", "error")] == 6
    assert c[("attnserve_response_cache_lookups_total", "translate", "hit")] == 0
    assert c[("attnserve_response_cache_lookups_total", "classify", "miss")] == 0  # every series from the start
    assert c[("attnserve_response_cache_failures_total", "get")] == 2
    assert ("attnserve_response_cache_failures_total", "set") not in c
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "answering without the cache" in warning.getMessage() and "127.0.0.1" in warning.getMessage()


def test_an_answer_too_large_is_not_kept_and_counted():
    metrics = Metrics()
    cache = ResponseCache(f"redis://127.0.0.1:{free_port()}/0", 60, 0.3, 256, observer=metrics.for_response_cache())

    async def scenario() -> None:
        await cache.put_many("classify", {"k": b"x" * 257})  # nothing left to write: Redis is not even asked
        await cache.close()

    asyncio.run(scenario())
    c = counted(metrics)
    assert c[("attnserve_response_cache_oversized_total", "classify")] == 1
    assert ("attnserve_response_cache_failures_total", "set") not in c


def test_the_cache_exists_only_when_enabled():
    from service.settings import Settings

    assert ResponseCache.from_settings(Settings()) is None
    cache = ResponseCache.from_settings(
        Settings(
            response_cache=True,
            redis_url="redis://127.0.0.1:1/0",
            response_cache_scope="key",
            api_key_hashes=["0" * 64],
        )
    )
    assert cache is not None and cache.scope == "key" and cache.ttl_s == 86_400
    assert cache.keys("translate", MODEL, OPTIONS, "k1").text(TEXT) != cache.keys(
        "translate", MODEL, OPTIONS, "k2"
    ).text(TEXT)
    shared = ResponseCache.from_settings(Settings(response_cache=True, redis_url="redis://127.0.0.1:1/0"))
    assert shared is not None
    assert shared.keys("translate", MODEL, OPTIONS, "k1").text(TEXT) == shared.keys(
        "translate", MODEL, OPTIONS, "k2"
    ).text(TEXT)
    asyncio.run(cache.close())
    asyncio.run(shared.close())


def test_a_redis_slower_than_the_budget_keeps_no_request_waiting_past_it(redis):
    """A real Redis 300 ms late behind a delaying proxy: the lookup is given up at the budget (a failure, then a
    second without asking), a store keeps its request no longer than the budget and lands in the background."""
    from benchmarks.delay_proxy import DelayProxy

    metrics, clock = Metrics(), Clock()
    stored = key(text="stored in the background")

    async def scenario(cache) -> tuple:
        started = time.monotonic()
        looked = await cache.get_many("translate", [key(text="slow")], decode_translation)
        lookup_s = time.monotonic() - started
        clock.now += 1.5  # past the second the cache is left alone
        started = time.monotonic()
        await cache.put_many("translate", {stored: b'{"translation": "x"}'})
        store_s = time.monotonic() - started
        for _ in range(100):  # the store goes on (a new connection's handshake is slow too) and lands
            if not cache._stores:
                break
            await asyncio.sleep(0.05)
        await cache.close()
        return looked, lookup_s, store_s

    with DelayProxy(redis.port, 0.3) as proxy:
        cache = ResponseCache(
            proxy.url, 60, 2.0, 65536, observer=metrics.for_response_cache(), clock=clock, budget_s=0.05
        )
        looked, lookup_s, store_s = asyncio.run(scenario(cache))
    assert looked is None and lookup_s < 0.3 and store_s < 0.3  # neither waited for Redis's 300 ms
    assert redis_py.Redis(port=redis.port).get(stored) == b'{"translation": "x"}'
    c = counted(metrics)
    assert c[("attnserve_response_cache_failures_total", "get")] == 1
    assert c[("attnserve_response_cache_failures_total", "set")] == 1  # too slow: the cache is left alone again


def test_a_lookup_is_never_made_past_the_requests_deadline(redis):
    metrics = Metrics()

    async def scenario() -> list | None:
        cache = ResponseCache(redis.url, 60, 2.0, 65536, observer=metrics.for_response_cache())
        try:
            return await cache.get_many("translate", [key()], decode_translation, deadline=time.monotonic() - 0.01)
        finally:
            await cache.close()

    assert asyncio.run(scenario()) is None
    c = counted(metrics)
    assert c[("attnserve_response_cache_lookups_total", "translate", "error")] == 1
    assert ("attnserve_response_cache_failures_total", "get") not in c  # Redis was not asked: nothing failed
