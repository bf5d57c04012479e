"""Prometheus metrics, one ``CollectorRegistry`` per app so that two apps in one process never mix.

Queue wait and compute time are separate histograms because they call for different fixes: a long
wait means too little capacity or too long a batching delay, a long compute means a slow model.
They are also what the Open Inference Protocol's statistics extension answers
(``service/statistics.py`` reads them back), so ``/metrics`` and ``/v2/models/stats`` cannot disagree.
"""

from __future__ import annotations

import time
from bisect import bisect_left

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
    generate_latest,
)

# From 0.25 ms: single-image CPU inference of a small ViT takes about a millisecond.
LATENCY_BUCKETS = (
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 4096)


def size_bucket(size: int) -> int:
    """The smallest of ``BATCH_BUCKETS`` a batch of ``size`` fits (the largest for anything larger): the
    ``batch_size`` label of ``attnserve_execution_seconds``, so that a model version has at most
    ``len(BATCH_BUCKETS)`` series however large its batches or running decoder batch grow."""
    return BATCH_BUCKETS[min(bisect_left(BATCH_BUCKETS, size), len(BATCH_BUCKETS) - 1)]


class Metrics:
    """Every metric the service exports; methods take plain values so callers need no prometheus import."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "attnserve_http_requests",
            "HTTP requests answered, by route template, method and status. Deprecated until 0.2.0: gRPC calls "
            "also count here, under the route `grpc:<RPC>` and the method `GRPC` (see attnserve_grpc_calls).",
            ["route", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "attnserve_http_request_duration_seconds",
            "Time from request start to the last response byte. Deprecated until 0.2.0: gRPC calls also count "
            "here, as in attnserve_http_requests.",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.calls = Counter(
            "attnserve_grpc_calls",
            "gRPC calls answered, by RPC and gRPC status code; each request of a ModelStreamInfer stream counts as "
            "a call.",
            ["method", "code"],
            registry=r,
        )
        self.call_latency = Histogram(
            "attnserve_grpc_call_duration_seconds",
            "Time from a gRPC call's handler start to its answer, by RPC.",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.quota_refusals = Counter(
            "attnserve_quota_refusals",
            "Requests answered 429 `quota_exceeded` (gRPC: RESOURCE_EXHAUSTED), by the measure that was over.",
            ["measure"],
            registry=r,
        )
        self.quota_store_errors = Counter(
            "attnserve_quota_store_errors",
            "Quota charges the Redis of `quota_store=redis` failed or did not answer (let through uncounted).",
            registry=r,
        )
        self.deadline_exceeded_requests = Counter(
            "attnserve_deadline_exceeded_requests",
            "Requests answered 504 `deadline_exceeded` (or streams ended by that `error` event; a gRPC call: "
            "DEADLINE_EXCEEDED, under `grpc:<RPC>`), by route template.",
            ["route"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "attnserve_queue_wait_seconds",
            "Time a request waited in its model's queue before its batch ran.",
            ["model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.compute = Histogram(
            "attnserve_compute_seconds",
            "onnxruntime time of one batch.",
            ["model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "attnserve_batch_size",
            "Images per onnxruntime run.",
            ["model", "version"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.executions = Summary(
            "attnserve_execution_seconds",
            "onnxruntime time of each execution by its batch size, a classifier batch (images) or a decoder step "
            "(rows), rounded up to the next of 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 4096.",
            ["model", "version", "batch_size"],
            registry=r,
        )
        self.model_requests = Histogram(
            "attnserve_model_request_duration_seconds",
            "Time from queueing a request on its model (a translation: each text) to its answer, by outcome: "
            "`success`, or `fail` (failed batch, deadline, client gone, shutdown).",
            ["model", "version", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.last_inference = Gauge(
            "attnserve_last_inference_timestamp_seconds",
            "When the model last answered a request successfully (Unix time).",
            ["model", "version"],
            registry=r,
        )
        self.images = Counter("attnserve_images", "Images classified.", ["model", "version"], registry=r)
        self.queued_images = Gauge(
            "attnserve_queue_images", "Images waiting in the model's queue.", ["model", "version"], registry=r
        )
        self.dropped = Counter(
            "attnserve_dropped_requests",
            "Requests dropped before compute, or decoding cut short, because their client went away or their "
            "deadline passed.",
            ["model", "version"],
            registry=r,
        )
        self.rejected = Counter(
            "attnserve_rejected_requests",
            "Requests refused because the model's queue was full.",
            ["model", "version"],
            registry=r,
        )
        self.failed_batches = Counter(
            "attnserve_failed_batches",
            "Batches whose onnxruntime run raised: a classifier batch, a translation's encoder run or decoder step.",
            ["model", "version"],
            registry=r,
        )
        self.priority_queue_wait = Histogram(
            "attnserve_priority_queue_wait_seconds",
            "Translation: time a sentence waited before it joined a decoding batch, by the request's priority "
            "(`interactive` or `batch`).",
            ["model", "version", "priority"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.engine_restarts = Counter(
            "attnserve_engine_restarts",
            "Times a loop of a model's engine (a translation lane, a classification instance thread) failed outside "
            "onnxruntime, answered what it held 500 and was restarted (service/engine/supervision.py).",
            ["model", "version"],
            registry=r,
        )
        self.provider = Gauge(
            "attnserve_model_provider_info",
            "1 for the execution provider each loaded model actually runs on.",
            ["model", "version", "provider"],
            registry=r,
        )
        self.load_failures = Counter(
            "attnserve_model_load_failures",
            "Model versions that failed to load (bad sha256, broken graph, manifest error).",
            ["model", "version"],
            registry=r,
        )
        self.ready = Gauge(
            "attnserve_model_ready", "1 when the model is loaded and warmed up.", ["model", "version"], registry=r
        )

        self.generated_tokens = Counter(
            "attnserve_generated_tokens",
            "Tokens generated by decoder steps (one per running sentence per step).",
            ["model", "version"],
            registry=r,
        )
        self.running_rows = Gauge(
            "attnserve_running_sequences",
            "Decoder rows in the running batch (a beam takes beam rows).",
            ["model", "version"],
            registry=r,
        )
        self.waiting_rows = Gauge(
            "attnserve_waiting_sequences",
            "Decoder rows waiting to join the running batch.",
            ["model", "version"],
            registry=r,
        )
        self.step_time = Histogram(
            "attnserve_decode_step_seconds",
            "onnxruntime time of one decoder step over the running batch.",
            ["model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.step_rows = Histogram(
            "attnserve_decode_step_rows",
            "Rows per decoder step.",
            ["model", "version"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.time_per_token = Histogram(
            "attnserve_time_per_output_token_seconds",
            "A finished sentence's decoding time divided by its tokens.",
            ["model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.first_token = Histogram(
            "attnserve_time_to_first_token_seconds",
            "From queueing a sentence to its first generated token.",
            ["model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

        self._request_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self._call_children: dict[tuple[str, str], tuple[Counter, Histogram]] = {}

        self.connections = Gauge(
            "attnserve_http_connections",
            "HTTP connections open in this process (service/http/connections.py).",
            registry=r,
        )
        self.connections_closed = Counter(
            "attnserve_http_connections_closed",
            "HTTP connections the service closed to protect itself, by reason: `header_timeout` (its request line "
            "and headers took longer than ATTNSERVE_HEADER_TIMEOUT_S), `write_timeout` (its client read nothing of "
            "its answer for ATTNSERVE_WRITE_TIMEOUT_S), `evicted` (it waited longest for a request when a new "
            "connection came at the connection bound), `evicted_unread` (then, its answer unread longest), "
            "`evicted_body` (then, its body arriving longest), `refused` (a new connection at the bound while every "
            "connection had a request in progress: 503).",
            ["reason"],
            registry=r,
        )

        self.attention_records = Gauge(
            "attnserve_attention_store_records", "Attention records kept (memory store).", registry=r
        )
        self.attention_bytes = Gauge(
            "attnserve_attention_store_bytes", "Bytes of attention maps kept (memory store).", registry=r
        )
        self.attention_evictions = Counter(
            "attnserve_attention_store_evictions",
            "Attention records removed before being asked for again, by reason "
            "(`ttl`: expired, `size`: evicted for the size cap).",
            ["reason"],
            registry=r,
        )
        self.attention_failures = Counter(
            "attnserve_attention_store_failures",
            "Attention-store calls that failed (Redis unreachable), by operation.",
            ["operation"],
            registry=r,
        )

        self.response_cache_lookups = Counter(
            "attnserve_response_cache_lookups",
            "Texts (translate) and images (classify) looked up in the response cache, by result: `hit`, `miss`, "
            "or `error` (Redis failed or failed less than a second ago: computed without the cache).",
            ["operation", "result"],
            registry=r,
        )
        self.response_cache_failures = Counter(
            "attnserve_response_cache_failures",
            "Response-cache calls to Redis that failed (unreachable, or slower than redis_timeout_s), by call "
            "(`get`: the lookup of a request, `set`: the writing of its new answers).",
            ["call"],
            registry=r,
        )
        self.response_cache_oversized = Counter(
            "attnserve_response_cache_oversized",
            "Answers of a text or image not cached because larger than response_cache_max_entry_bytes.",
            ["operation"],
            registry=r,
        )

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        children = self._request_children.get((route, method, status))
        if children is None:  # first request of its kind: resolve the labelled children once
            children = (self.requests.labels(route, method, str(status)), self.latency.labels(route, method))
            self._request_children[(route, method, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    def observe_call(self, method: str, code: str, status: int, seconds: float) -> None:
        """A gRPC call ``method`` answered with ``code`` (``status``: the HTTP status of its outcome)."""
        children = self._call_children.get((method, code))
        if children is None:
            children = (self.calls.labels(method, code), self.call_latency.labels(method))
            self._call_children[(method, code)] = children
        children[0].inc()
        children[1].observe(seconds)
        self.observe_request(f"grpc:{method}", "GRPC", status, seconds)  # the deprecated HTTP series, until 0.2.0

    def quota_refused(self, measures: list[str]) -> None:
        for measure in measures:
            self.quota_refusals.labels(measure).inc()

    def deadline_exceeded(self, route: str) -> None:
        self.deadline_exceeded_requests.labels(route).inc()

    def for_model(self, model: str, version: str) -> ModelMetrics:
        return ModelMetrics(self, model, version)

    def for_decoder(self, model: str, version: str) -> DecodeMetrics:
        return DecodeMetrics(self, model, version)

    def for_attention_store(self) -> AttentionStoreMetrics:
        return AttentionStoreMetrics(self)

    def for_connections(self) -> ConnectionMetrics:
        return ConnectionMetrics(self)

    def for_response_cache(self) -> ResponseCacheMetrics:
        return ResponseCacheMetrics(self)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class ModelMetrics:
    """The batcher's view of the metrics, with the model and version labels bound once instead of per observation."""

    def __init__(self, metrics: Metrics, model: str, version: str) -> None:
        self._queue_wait = metrics.queue_wait.labels(model, version)
        self._compute = metrics.compute.labels(model, version)
        self._batch_size = metrics.batch_size.labels(model, version)
        self._images = metrics.images.labels(model, version)
        self._queued = metrics.queued_images.labels(model, version)
        self._dropped = metrics.dropped.labels(model, version)
        self._rejected = metrics.rejected.labels(model, version)
        self._failed = metrics.failed_batches.labels(model, version)
        self._restarts = metrics.engine_restarts.labels(model, version)
        self._answers = Answers(metrics, model, version)

    def batch_started(self, images: int, queue_waits: list[float]) -> None:
        self._batch_size.observe(images)
        for wait in queue_waits:
            self._queue_wait.observe(wait)

    def batch_finished(self, images: int, compute_seconds: float, ok: bool) -> None:
        self._compute.observe(compute_seconds)
        self._answers.executed(images, compute_seconds)
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

    def restarted(self) -> None:
        self._restarts.inc()

    def answered(self, seconds: float, ok: bool) -> None:
        self._answers.answered(seconds, ok)


class DecodeMetrics:
    """The translation scheduler's view of the metrics (see ``service.engine.scheduler.DecodeObserver``)."""

    def __init__(self, metrics: Metrics, model: str, version: str) -> None:
        self._tokens = metrics.generated_tokens.labels(model, version)
        self._running = metrics.running_rows.labels(model, version)
        self._waiting = metrics.waiting_rows.labels(model, version)
        self._step = metrics.step_time.labels(model, version)
        self._rows = metrics.step_rows.labels(model, version)
        self._per_token = metrics.time_per_token.labels(model, version)
        self._first = metrics.first_token.labels(model, version)
        self._queue_wait = metrics.queue_wait.labels(model, version)
        self._dropped = metrics.dropped.labels(model, version)
        self._rejected = metrics.rejected.labels(model, version)
        self._restarts = metrics.engine_restarts.labels(model, version)
        self._failed = metrics.failed_batches.labels(model, version)
        self._priority_wait = {
            p: metrics.priority_queue_wait.labels(model, version, p) for p in ("interactive", "batch")
        }
        self._answers = Answers(metrics, model, version)

    def restarted(self) -> None:
        self._restarts.inc()

    def failed(self) -> None:
        self._failed.inc()

    def step(self, rows: int, seconds: float, tokens: int) -> None:
        self._step.observe(seconds)
        self._answers.executed(rows, seconds)
        self._rows.observe(rows)
        self._tokens.inc(tokens)

    def occupancy(self, running: int, waiting: int) -> None:
        self._running.set(running)
        self._waiting.set(waiting)

    def finished(
        self, tokens: int, seconds: float, queue_wait: float, first_token: float | None, priority: str = "interactive"
    ) -> None:
        self._per_token.observe(seconds / max(1, tokens))
        self._queue_wait.observe(queue_wait)
        self._priority_wait[priority].observe(queue_wait)
        if first_token is not None:
            self._first.observe(first_token)

    def cancelled(self) -> None:
        self._dropped.inc()

    def rejected(self) -> None:
        self._rejected.inc()

    def answered(self, seconds: float, ok: bool) -> None:
        self._answers.answered(seconds, ok)


class Answers:
    """What both engines report the same way: each execution by batch size, each request's outcome."""

    def __init__(self, metrics: Metrics, model: str, version: str) -> None:
        self._executions = metrics.executions
        self._by_size: dict[int, Summary] = {}  # the labelled child of each batch size (its bucket), resolved once
        self._labels = (model, version)
        self._success = metrics.model_requests.labels(model, version, "success")
        self._fail = metrics.model_requests.labels(model, version, "fail")
        self._last = metrics.last_inference.labels(model, version)

    def executed(self, batch_size: int, seconds: float) -> None:
        child = self._by_size.get(batch_size)
        if child is None:
            child = self._by_size[batch_size] = self._executions.labels(*self._labels, str(size_bucket(batch_size)))
        child.observe(seconds)

    def answered(self, seconds: float, ok: bool) -> None:
        if ok:
            self._success.observe(seconds)
            self._last.set(time.time())
        else:
            self._fail.observe(seconds)


class AttentionStoreMetrics:
    """The attention store's view of the metrics (see ``service.attention.store.StoreObserver``)."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def stored(self, records: int, nbytes: int) -> None:
        self._m.attention_records.set(records)
        self._m.attention_bytes.set(nbytes)

    def evicted(self, reason: str, count: int = 1) -> None:
        self._m.attention_evictions.labels(reason).inc(count)

    def failed(self, operation: str) -> None:
        self._m.attention_failures.labels(operation).inc()


class ConnectionMetrics:
    """The HTTP connections' view of the metrics (see ``service.http.connections.ConnectionObserver``)."""

    def __init__(self, metrics: Metrics) -> None:
        self._open = metrics.connections
        reasons = ("header_timeout", "write_timeout", "evicted", "evicted_unread", "evicted_body", "refused")
        self._closed = {r: metrics.connections_closed.labels(r) for r in reasons}

    def open(self, count: int) -> None:
        self._open.set(count)

    def closed(self, reason: str) -> None:
        self._closed[reason].inc()


class ResponseCacheMetrics:
    """The response cache's view of the metrics (see ``service.core.response_cache.CacheObserver``)."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def looked_up(self, operation: str, result: str, count: int) -> None:
        self._m.response_cache_lookups.labels(operation, result).inc(count)

    def failed(self, call: str) -> None:
        self._m.response_cache_failures.labels(call).inc()

    def oversized(self, operation: str, count: int) -> None:
        self._m.response_cache_oversized.labels(operation).inc(count)
