"""How the soak judges: an answer by what its model went through while it ran, the run by its samples.

The soak (``benchmarks/soak.py``) runs for half an hour, so the rules its verdict rests on are
checked here on answers and samples made up for the purpose; ``tests/test_benchmarks.py`` runs it
briefly against the real service.
"""

from __future__ import annotations

import argparse
import asyncio

import pytest

from benchmarks.soak import judge
from benchmarks.soak_routes import Answer, Models, Route, Soak
from tests.conftest import ROOT


@pytest.fixture
def soak() -> Soak:
    return Soak(Models("vit", "translator"), ROOT / "models", rate=1.0, ttl_s=60)


def answering(status: int, then: str | None = None, problem: str | None = None):
    """A call that answers ``status``, after moving the classifier to ``then`` while it ran."""

    async def call(soak: Soak, http: object) -> Answer:
        if then is not None:
            soak.models["vit"].set(then)
        return Answer(status, problem)

    return call


def kinds(soak: Soak) -> dict[str, int]:
    return {f"{status} {kind}": n for (_, status, kind), n in soak.counts.items()}


@pytest.mark.parametrize(
    ("state", "then", "status", "model", "kind"),
    [
        ("serving", None, 200, "vit", "ok"),
        ("serving", None, 404, "vit", "unexpected"),  # the model serves: a 404 is a bug
        ("unloaded", None, 404, "vit", "while a model was away"),
        ("unloaded", None, 200, "vit", "unexpected"),  # unloaded, yet it answered
        ("unloaded", None, 503, "vit", "unexpected"),  # unloaded is 404, not 503
        ("serving", "unloading", 503, "vit", "while a model was away"),  # the unload began while it ran
        ("loading", "serving", 404, "vit", "while a model was away"),
        ("unloaded", None, 200, "*", "ok"),  # readiness: what is loaded is ready
        ("unloaded", None, 503, "*", "unexpected"),
        ("loading", None, 503, "*", "while a model was away"),
        ("unloaded", None, 200, "translator", "ok"),  # the other model serves on
        ("serving", None, 500, "vit", "unexpected"),
    ],
)
def test_an_answer_is_judged_by_every_state_its_model_went_through(soak, state, then, status, model, kind):
    soak.models["vit"].set(state)
    asyncio.run(soak.call(Route("route", answering(status, then), model), None))
    assert kinds(soak) == {f"{status} {kind}": 1}


def test_a_documented_status_with_the_wrong_body_is_a_problem(soak):
    asyncio.run(soak.call(Route("route", answering(200, problem="no attention id"), "vit"), None))
    asyncio.run(soak.call(Route("expired id", answering(404), expect=frozenset({404})), None))
    assert kinds(soak) == {"200 malformed": 1, "404 ok": 1}
    assert soak.unexpected() == 1 and soak.first_problems[0].endswith("route: 200 no attention id")


BOUNDS = argparse.Namespace(rss_growth_mib=32.0, fd_slack=4, thread_slack=2)


def samples(**changes: list) -> list[dict]:
    """Six samples 60 s apart of a steady process, with the listed series replaced."""
    series = {"rss_mib": [200.0] * 6, "fds": [40] * 6, "threads": [20] * 6, "redis_keys": [100] * 6}
    series |= changes
    bound, unloaded = series.pop("bound", [150] * 6), series.pop("unloaded", [[]] * 6)
    return [
        {"t_s": 60.0 * i, **{k: v[i] for k, v in series.items()}, "redis_keys_bound": bound[i], "unloaded": unloaded[i]}
        for i in range(6)
    ]


@pytest.mark.parametrize(
    ("changes", "failure"),
    [
        ({}, None),
        ({"rss_mib": [100.0, 200, 210, 220, 225, 230]}, None),  # the warm-up's growth does not count
        (
            {"rss_mib": [100.0, 200, 210, 220, 230, 240]},
            (
                "RSS grew 40.0 MiB after the warm-up: median 200.0 MiB in the first third of the samples with "
                "every model loaded, 240.0 MiB in the last (bound 32.0 MiB)"
            ),
        ),
        ({"rss_mib": [100.0, 200, 290, 200, 200, 205]}, None),  # a peak that came back down: no trend
        # samples with a model away are not compared with those with every model loaded
        ({"rss_mib": [100.0, 200, 210, 220, 215, 150], "unloaded": [[]] * 5 + [["translator"]]}, None),
        ({"fds": [40, 40, 42, 44, 46, 45]}, "fds went from 40 to max 46, end 45 (bound baseline + 4)"),
        ({"fds": [40, 40, 42, 44, 40, 30]}, None),  # fewer at the end: connections closing, not a leak
        ({"threads": [20, 20, 20, 20, 20, 23]}, "threads went from 20 to max 23, end 23 (bound baseline + 2)"),
        ({"redis_keys": [100, 100, 160, 100, 100, 100]}, "160 Redis keys at 120 s, over the TTL bound 150"),
        # a model away at the warm-up's end: the baseline is the next sample with every model loaded
        ({"threads": [20, 16, 20, 20, 20, 20], "unloaded": [[], ["vit"], [], [], [], []]}, None),
    ],
)
def test_the_verdict_fails_on_growth_beyond_its_bounds(changes, failure):
    failures: list[str] = []
    figures = judge(samples(**changes), 60.0, BOUNDS, failures)
    assert failures == ([failure] if failure else [])
    assert figures["rss_mib"]["start"] == samples(**changes)[0]["rss_mib"]
