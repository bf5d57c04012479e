"""An upgrade with the shared response cache: a build never serves an answer another build computed.

Two services share one Redis: this checkout (the old build) and a copy of it whose code that answers
differs by one line (the new build, as after an upgrade; ``service/build.py``). What the old one cached is a
miss for the new one, and the other way round, while each still hits its own entries: during a rolling
upgrade the two versions share no answer.
"""

from __future__ import annotations

import shutil

import httpx

from tests.conftest import ROOT
from tests.service.service_testing import start_subprocess_server

TEXT = {"text": "Saves every open document before the upgrade.", "beam_size": 1}


def test_a_new_build_never_serves_what_the_old_build_cached(tiny_translator_repository, redis, tmp_path):
    new_tree = tmp_path / "new-build"
    for package in ("service", "contract"):
        shutil.copytree(ROOT / package, new_tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    with open(new_tree / "service" / "core" / "translate.py", "a", encoding="utf-8") as f:
        f.write("\n# the new build: one line of the code that answers changed\n")
    settings = {"response_cache": "true", "redis_url": redis.url, "response_cache_budget_ms": "500"}
    builds = {
        "old": start_subprocess_server(tmp_path, tiny_translator_repository, **settings),
        "new": start_subprocess_server(tmp_path, tiny_translator_repository, root=new_tree, **settings),
    }
    try:
        for srv in builds.values():
            srv.wait_ready()

        def cache(build: str) -> str:
            r = httpx.post(builds[build].url + "/translate", json=TEXT, timeout=60)
            assert r.status_code == 200, r.text
            return r.headers["x-cache"]

        assert [cache("old"), cache("old")] == ["miss", "hit"]  # the old build keeps and finds its answer
        assert [cache("new"), cache("new")] == ["miss", "hit"]  # the new one never reads it: it computes its own
        assert cache("old") == "hit"  # both entries live side by side, each for its own build
    finally:
        for srv in builds.values():
            srv.stop()
