"""The Open Inference Protocol's statistics extension (Triton's ``ModelStatistics``), read from the metrics.

Nothing is counted twice: every number is read back from the Prometheus metrics the engines
already keep (``service/metrics.py``), so ``/metrics`` and ``/v2/models/stats`` cannot disagree.

- ``inference_count``: inferences answered, images classified or texts translated
  (``attnserve_images``; a translation: ``attnserve_time_per_output_token_seconds``, observed once
  per translated text);
- ``execution_count``, ``batch_stats``: onnxruntime executions by batch size, classifier batches or
  decoder steps (``attnserve_execution_seconds``); a size is rounded up to the next of
  ``service.metrics.BATCH_BUCKETS`` (1, 2, 3, 4, 6, 8, 12, 16, ...), so that a model version has a
  bounded number of series: a batch of 5 counts under ``batch_size`` 6;
- ``success``, ``fail``: requests queued on the model by outcome, with their time from queueing to
  answer (``attnserve_model_request_duration_seconds``; a translation's texts count one each);
- ``queue``: time waited in the queue before the batch ran (``attnserve_queue_wait_seconds``);
- ``compute_infer``: the executions' onnxruntime time, which includes copying inputs in and outputs
  out; ``compute_input`` and ``compute_output`` are not timed apart, and stay 0.

Durations are nanoseconds, ``last_inference`` milliseconds since the epoch (0: none yet).
"""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.metrics import MetricWrapperBase

from service.metrics import Metrics
from service.translator import TASK as TRANSLATION

NOT_TIMED = {"count": 0, "ns": 0}


def model_statistics(metrics: Metrics, models: list[tuple[str, str, str | None]]) -> list[dict]:
    """Triton's ``model_stats`` entries of ``(name, version, task)`` model versions."""
    requests = _read(metrics.model_requests, "outcome")
    queue = _read(metrics.queue_wait)
    executions = _read(metrics.executions, "batch_size")
    images = _read(metrics.images)
    texts = _read(metrics.time_per_token)
    last = _read(metrics.last_inference)
    by_size: dict[tuple[str, str], dict[int, dict]] = defaultdict(dict)
    for (name, version, size), value in executions.items():
        by_size[name, version][int(size)] = value
    out = []
    for name, version, task in models:
        key = (name, version)
        sizes = by_size.get(key, {})
        inferences = texts.get(key) if task == TRANSLATION else images.get(key)
        out.append(
            {
                "name": name,
                "version": version,
                "last_inference": round(last.get(key, {}).get("value", 0.0) * 1000),
                "inference_count": round((inferences or {}).get("count", 0)),
                "execution_count": sum(round(s["count"]) for s in sizes.values()),
                "inference_stats": {
                    "success": _duration(requests.get((name, version, "success"))),
                    "fail": _duration(requests.get((name, version, "fail"))),
                    "queue": _duration(queue.get(key)),
                    "compute_input": NOT_TIMED,
                    "compute_infer": _duration(_total(sizes.values())),
                    "compute_output": NOT_TIMED,
                },
                "batch_stats": [
                    {
                        "batch_size": size,
                        "compute_input": NOT_TIMED,
                        "compute_infer": _duration(sizes[size]),
                        "compute_output": NOT_TIMED,
                    }
                    for size in sorted(sizes)
                ],
            }
        )
    return out


def _read(metric: MetricWrapperBase, *labels: str) -> dict[tuple[str, ...], dict[str, float]]:
    """Each series of ``metric`` by its model, version and ``labels``: ``count`` and ``sum`` (a histogram
    or a summary), ``count`` (a counter's total) or ``value`` (a gauge)."""
    names = ("model", "version", *labels)
    out: dict[tuple[str, ...], dict[str, float]] = defaultdict(dict)
    for family in metric.collect():
        for sample in family.samples:
            kind = sample.name.removeprefix(family.name).removeprefix("_") or "value"
            field = {"count": "count", "sum": "sum", "total": "count", "value": "value"}.get(kind)
            if field is not None:
                out[tuple(sample.labels[n] for n in names)][field] = sample.value
    return out


def _total(series) -> dict[str, float]:
    return {"count": sum(s["count"] for s in series), "sum": sum(s["sum"] for s in series)}


def _duration(series: dict[str, float] | None) -> dict[str, int]:
    if not series:
        return {"count": 0, "ns": 0}
    return {"count": round(series["count"]), "ns": round(series["sum"] * 1e9)}
