"""Prometheus metrics, one ``CollectorRegistry`` per app so that two apps in one process never mix.

Queue wait and compute time are separate histograms because they call for different fixes: a long
wait means too little capacity or too long a batching delay, a long compute means a slow model.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# From 0.25 ms: single-image CPU inference of a small ViT takes about a millisecond.
LATENCY_BUCKETS = (0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 4096)


class Metrics:
    """Every metric the service exports; methods take plain values so callers need no prometheus import."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "attnserve_http_requests", "HTTP requests answered, by route template and status.",
            ["route", "method", "status"], registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            "attnserve_http_request_duration_seconds", "Time from request start to the last response byte.",
            ["route", "method"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "attnserve_queue_wait_seconds", "Time a request waited in its model's queue before its batch ran.",
            ["model"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.compute = Histogram(
            "attnserve_compute_seconds", "onnxruntime time of one batch.",
            ["model"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.batch_size = Histogram(
            "attnserve_batch_size", "Images per onnxruntime run.", ["model"], buckets=BATCH_BUCKETS, registry=r
        )
        self.images = Counter("attnserve_images", "Images classified.", ["model"], registry=r)
        self.queued_images = Gauge("attnserve_queue_images", "Images waiting in the model's queue.", ["model"], registry=r)
        self.dropped = Counter(
            "attnserve_dropped_requests", "Requests dropped before compute because their client went away.",
            ["model"], registry=r,
        )  # fmt: skip
        self.rejected = Counter(
            "attnserve_rejected_requests", "Requests refused because the model's queue was full.", ["model"], registry=r
        )
        self.failed_batches = Counter(
            "attnserve_failed_batches", "Batches whose onnxruntime run raised.", ["model"], registry=r
        )
        self.provider = Gauge(
            "attnserve_model_provider_info", "1 for the execution provider each loaded model actually runs on.",
            ["model", "version", "provider"], registry=r,
        )  # fmt: skip
        self.ready = Gauge("attnserve_model_ready", "1 when the model is loaded and warmed up.", ["model", "version"], registry=r)

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route, method).observe(seconds)

    def for_model(self, model: str) -> ModelMetrics:
        return ModelMetrics(self, model)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class ModelMetrics:
    """The batcher's view of the metrics, with the model label bound once instead of per observation."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self._queue_wait = metrics.queue_wait.labels(model)
        self._compute = metrics.compute.labels(model)
        self._batch_size = metrics.batch_size.labels(model)
        self._images = metrics.images.labels(model)
        self._queued = metrics.queued_images.labels(model)
        self._dropped = metrics.dropped.labels(model)
        self._rejected = metrics.rejected.labels(model)
        self._failed = metrics.failed_batches.labels(model)

    def batch_started(self, images: int, queue_waits: list[float]) -> None:
        self._batch_size.observe(images)
        for wait in queue_waits:
            self._queue_wait.observe(wait)

    def batch_finished(self, images: int, compute_seconds: float, ok: bool) -> None:
        self._compute.observe(compute_seconds)
        if ok:
            self._images.inc(images)
        else:
            self._failed.inc()

    def queue_depth(self, images: int) -> None:
        self._queued.set(images)

    def dropped(self, requests: int) -> None:
        self._dropped.inc(requests)

    def rejected(self) -> None:
        self._rejected.inc()
