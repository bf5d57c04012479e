"""The statistics extension's numbers, from a real batcher through the service's Prometheus metrics: every
way a request ends is counted once, under the outcome the client saw."""

from __future__ import annotations

import asyncio

import pytest

from service.errors import InferenceFailed
from service.metrics import Metrics
from service.statistics import model_statistics
from tests.service.engine.test_batching import Doubler, make_batcher, rows


def test_answers_failures_and_abandoned_requests_are_counted_once_each():
    metrics = Metrics()

    async def scenario():
        model = Doubler()
        model.fail_when = lambda x: bool((x == -1).any())
        batcher = make_batcher(model, observer=metrics.for_model("vit", "1"))
        batcher.start()
        await batcher.submit(rows(1, 2))  # a batch of 2 images
        with pytest.raises(InferenceFailed):
            await batcher.submit(rows(-1))  # a failed batch of 1
        model.gate.clear()
        running = batcher.submit(rows(3))
        await asyncio.to_thread(model.entered.wait, 30)
        abandoned = batcher.submit(rows(99))
        abandoned.cancel()  # its client went away: never computed
        model.gate.set()
        await running
        await batcher.stop()

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    (stats,) = model_statistics(metrics, [("vit", "1", "image-classification")])
    inference = stats["inference_stats"]
    assert (stats["name"], stats["version"]) == ("vit", "1")
    assert stats["inference_count"] == 3 and stats["execution_count"] == 3  # images answered; batches run
    assert (inference["success"]["count"], inference["fail"]["count"], inference["queue"]["count"]) == (2, 2, 3)
    assert all(inference[k]["ns"] > 0 for k in ("success", "fail", "queue", "compute_infer"))
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    assert sizes == {1: 2, 2: 1} and inference["compute_infer"]["count"] == 3
    assert stats["last_inference"] > 0


def test_a_model_that_answered_nothing_has_zeros():
    (stats,) = model_statistics(Metrics(), [("translator", "3", "translation")])
    assert stats["inference_count"] == stats["execution_count"] == stats["last_inference"] == 0
    assert all(v == {"count": 0, "ns": 0} for v in stats["inference_stats"].values())
    assert stats["batch_stats"] == []
