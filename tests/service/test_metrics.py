"""Every metric the service exports, updated through ``service.metrics``' own API and read back from the
exposition text that Prometheus scrapes (parsed with prometheus_client's parser)."""

from __future__ import annotations

import math

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.metrics import BATCH_BUCKETS, LATENCY_BUCKETS, Metrics, size_bucket


def families(metrics: Metrics) -> dict:
    """The exposition's metric families, without the ``*_created`` timestamps prometheus_client adds."""
    body, _ = metrics.render()
    return {f.name: f for f in text_string_to_metric_families(body.decode()) if not f.name.endswith("_created")}


def samples(metrics: Metrics) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value for f in families(metrics).values() for s in f.samples}


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, frozenset(labels.items())))


def histogram(metrics: Metrics, name: str, **labels: str) -> dict:
    """``{"count", "sum", "buckets": {le: cumulative count}}`` of one labelled histogram."""
    out: dict = {"buckets": {}}
    for (sample, sample_labels), v in samples(metrics).items():
        d = dict(sample_labels)
        le = d.pop("le", None)
        if d != labels:
            continue
        if sample == f"{name}_bucket":
            out["buckets"][float(le)] = v
        elif sample == f"{name}_count":
            out["count"] = v
        elif sample == f"{name}_sum":
            out["sum"] = v
    return out


def cumulative(bounds, observations) -> dict[float, int]:
    """What a Prometheus histogram with ``bounds`` must show for ``observations`` (``le`` is inclusive)."""
    return {float(b): sum(1 for o in observations if o <= b) for b in (*bounds, math.inf)}


# The metrics table of docs/api.md, plus the attention store's: name -> (type, label names).
EXPORTED = {
    "attnserve_http_requests": ("counter", {"route", "method", "status"}),
    "attnserve_http_request_duration_seconds": ("histogram", {"route", "method"}),
    "attnserve_grpc_calls": ("counter", {"method", "code"}),
    "attnserve_grpc_call_duration_seconds": ("histogram", {"method"}),
    "attnserve_deadline_exceeded_requests": ("counter", {"route"}),
    "attnserve_quota_refusals": ("counter", {"measure"}),
    "attnserve_quota_store_errors": ("counter", set()),
    "attnserve_queue_wait_seconds": ("histogram", {"model", "version"}),
    "attnserve_priority_queue_wait_seconds": ("histogram", {"model", "version", "priority"}),
    "attnserve_compute_seconds": ("histogram", {"model", "version"}),
    "attnserve_batch_size": ("histogram", {"model", "version"}),
    "attnserve_images": ("counter", {"model", "version"}),
    "attnserve_execution_seconds": ("summary", {"model", "version", "batch_size"}),
    "attnserve_model_request_duration_seconds": ("histogram", {"model", "version", "outcome"}),
    "attnserve_last_inference_timestamp_seconds": ("gauge", {"model", "version"}),
    "attnserve_queue_images": ("gauge", {"model", "version"}),
    "attnserve_rejected_requests": ("counter", {"model", "version"}),
    "attnserve_dropped_requests": ("counter", {"model", "version"}),
    "attnserve_model_load_failures": ("counter", {"model", "version"}),
    "attnserve_failed_batches": ("counter", {"model", "version"}),
    "attnserve_engine_restarts": ("counter", {"model", "version"}),
    "attnserve_generated_tokens": ("counter", {"model", "version"}),
    "attnserve_running_sequences": ("gauge", {"model", "version"}),
    "attnserve_waiting_sequences": ("gauge", {"model", "version"}),
    "attnserve_decode_step_seconds": ("histogram", {"model", "version"}),
    "attnserve_decode_step_rows": ("histogram", {"model", "version"}),
    "attnserve_time_per_output_token_seconds": ("histogram", {"model", "version"}),
    "attnserve_time_to_first_token_seconds": ("histogram", {"model", "version"}),
    "attnserve_model_provider_info": ("gauge", {"model", "version", "provider"}),
    "attnserve_model_ready": ("gauge", {"model", "version"}),
    "attnserve_attention_store_records": ("gauge", set()),
    "attnserve_attention_store_bytes": ("gauge", set()),
    "attnserve_attention_store_evictions": ("counter", {"reason"}),
    "attnserve_attention_store_failures": ("counter", {"operation"}),
    "attnserve_http_connections": ("gauge", set()),
    "attnserve_http_connections_closed": ("counter", {"reason"}),
    "attnserve_response_cache_lookups": ("counter", {"operation", "result"}),
    "attnserve_response_cache_failures": ("counter", {"call"}),
    "attnserve_response_cache_oversized": ("counter", {"operation"}),
}


def touch_everything(m: Metrics) -> None:
    """One update of every metric, through the API the service uses for it."""
    m.observe_request("/classify", "POST", 200, 0.001)
    m.observe_call("ModelInfer", "OK", 200, 0.001)
    m.deadline_exceeded("/classify")
    m.quota_refused(["requests"])
    m.quota_store_errors.inc()
    batcher = m.for_model("vit", "1")
    batcher.batch_started(1, [0.001])
    batcher.batch_finished(1, 0.001, ok=True)
    batcher.queue_depth(0)
    batcher.dropped(1)
    batcher.rejected()
    batcher.answered(0.002, ok=True)
    decoder = m.for_decoder("translator", "1")
    decoder.step(1, 0.001, 1)
    decoder.occupancy(1, 0)
    decoder.finished(1, 0.001, 0.001, 0.001)
    decoder.answered(0.002, ok=False)
    store = m.for_attention_store()
    store.stored(1, 10)
    store.evicted("ttl")
    store.failed("get")
    connections = m.for_connections()
    connections.open(3)
    connections.closed("evicted")
    cache = m.for_response_cache()
    cache.looked_up("translate", "hit", 3)
    cache.failed("set")
    cache.oversized("classify", 1)
    m.provider.labels("vit", "1", "CPUExecutionProvider").set(1)  # as the registry marks a model ready
    m.ready.labels("vit", "1").set(1)
    m.load_failures.labels("vit", "3").inc()  # as the lifecycle counts a version that failed to load


def test_every_metric_is_exported_with_its_type_and_labels():
    m = Metrics()
    touch_everything(m)
    found = families(m)
    assert {name: f.type for name, f in found.items()} == {name: kind for name, (kind, _) in EXPORTED.items()}
    for name, (_, labels) in EXPORTED.items():
        assert found[name].documentation, name
        label_sets = {frozenset(s.labels) - {"le"} for s in found[name].samples}
        assert label_sets == {frozenset(labels)}, name
    body, content_type = m.render()
    assert content_type == prometheus_client.CONTENT_TYPE_LATEST and content_type.startswith("text/plain")
    assert b"\nattnserve_http_requests_total{" in body  # counters carry the _total suffix on the wire


def test_each_metrics_object_has_its_own_registry():
    a, b = Metrics(), Metrics()
    a.observe_request("/classify", "POST", 200, 0.01)
    a.for_model("vit", "1").rejected()
    assert value(a, "attnserve_http_requests_total", route="/classify", method="POST", status="200") == 1
    assert value(b, "attnserve_http_requests_total", route="/classify", method="POST", status="200") is None
    assert value(b, "attnserve_rejected_requests_total", model="vit", version="1") is None
    global_text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "attnserve_http_requests" not in global_text and "attnserve_rejected_requests" not in global_text


def test_observe_request_counts_by_route_method_and_status_and_times_by_route_and_method():
    m = Metrics()
    observations = [0.0004, 0.0004, 0.3]
    m.observe_request("/classify", "POST", 200, observations[0])
    m.observe_request("/classify", "POST", 200, observations[1])
    m.observe_request("/classify", "POST", 503, observations[2])
    m.observe_request("unmatched", "GET", 404, 0.002)
    counts = {
        tuple(dict(labels)[k] for k in ("route", "method", "status")): v
        for (name, labels), v in samples(m).items()
        if name == "attnserve_http_requests_total"
    }
    assert counts == {("/classify", "POST", "200"): 2, ("/classify", "POST", "503"): 1, ("unmatched", "GET", "404"): 1}
    h = histogram(m, "attnserve_http_request_duration_seconds", route="/classify", method="POST")
    assert h["count"] == 3 and h["sum"] == pytest.approx(sum(observations))
    assert h["buckets"] == cumulative(LATENCY_BUCKETS, observations)
    assert h["buckets"][0.00025] == 0 and h["buckets"][0.0005] == 2 and h["buckets"][0.25] == 2
    assert h["buckets"][0.5] == 3
    assert histogram(m, "attnserve_http_request_duration_seconds", route="unmatched", method="GET")["count"] == 1


def test_a_grpc_call_counts_by_rpc_and_code_and_in_the_deprecated_http_series():
    m = Metrics()
    m.observe_call("ModelInfer", "OK", 200, 0.001)
    m.observe_call("ModelInfer", "UNAVAILABLE", 503, 0.0002)
    m.observe_call("ServerLive", "OK", 200, 0.0001)
    calls = {
        (dict(labels)["method"], dict(labels)["code"]): v
        for (name, labels), v in samples(m).items()
        if name == "attnserve_grpc_calls_total"
    }
    assert calls == {("ModelInfer", "OK"): 1, ("ModelInfer", "UNAVAILABLE"): 1, ("ServerLive", "OK"): 1}
    assert histogram(m, "attnserve_grpc_call_duration_seconds", method="ModelInfer")["count"] == 2
    # the deprecated alias, until 0.2.0: the HTTP series under the route grpc:<RPC> and the method GRPC
    assert value(m, "attnserve_http_requests_total", route="grpc:ModelInfer", method="GRPC", status="503") == 1
    assert histogram(m, "attnserve_http_request_duration_seconds", route="grpc:ServerLive", method="GRPC")["count"] == 1


def test_executions_are_labelled_by_batch_size_bucket_so_a_version_has_boundedly_many_series():
    m = Metrics()
    decoder = m.for_decoder("translator", "1")
    for rows in range(1, 4097):  # every running batch size a decoder may step
        decoder.step(rows, 0.001, rows)
    sizes = {
        dict(labels)["batch_size"]: v
        for (name, labels), v in samples(m).items()
        if name == "attnserve_execution_seconds_count"
    }
    assert sorted(map(int, sizes)) == list(BATCH_BUCKETS)
    assert sizes["1"] == sizes["2"] == sizes["3"] == sizes["4"] == 1  # small sizes stay exact
    assert sizes["6"] == 2 and sizes["4096"] == 4096 - 1024 and sum(sizes.values()) == 4096  # 5 and 6 under 6
    assert [size_bucket(n) for n in (1, 5, 7, 33, 4096, 5000)] == [1, 6, 8, 48, 4096, 4096]


def test_deadlines_exceeded_are_counted_by_route_template():
    m = Metrics()
    m.deadline_exceeded("/classify")
    m.deadline_exceeded("/translate")
    m.deadline_exceeded("/translate")
    assert value(m, "attnserve_deadline_exceeded_requests_total", route="/classify") == 1
    assert value(m, "attnserve_deadline_exceeded_requests_total", route="/translate") == 2


def test_histograms_use_the_latency_or_the_batch_buckets():
    m = Metrics()
    touch_everything(m)
    latency = (*map(float, LATENCY_BUCKETS), math.inf)
    batch = (*map(float, BATCH_BUCKETS), math.inf)
    expected = {
        ("attnserve_http_request_duration_seconds", (("route", "/classify"), ("method", "POST"))): latency,
        ("attnserve_queue_wait_seconds", (("model", "vit"), ("version", "1"))): latency,
        ("attnserve_compute_seconds", (("model", "vit"), ("version", "1"))): latency,
        ("attnserve_batch_size", (("model", "vit"), ("version", "1"))): batch,
        ("attnserve_decode_step_seconds", (("model", "translator"), ("version", "1"))): latency,
        ("attnserve_decode_step_rows", (("model", "translator"), ("version", "1"))): batch,
        ("attnserve_time_per_output_token_seconds", (("model", "translator"), ("version", "1"))): latency,
        ("attnserve_time_to_first_token_seconds", (("model", "translator"), ("version", "1"))): latency,
    }
    for (name, labels), bounds in expected.items():
        assert tuple(histogram(m, name, **dict(labels))["buckets"]) == bounds, name
    assert LATENCY_BUCKETS[0] == 0.00025 and list(LATENCY_BUCKETS) == sorted(LATENCY_BUCKETS)
    assert BATCH_BUCKETS[0] == 1 and list(BATCH_BUCKETS) == sorted(BATCH_BUCKETS)


def test_the_batcher_view_updates_the_model_s_metrics_only():
    m = Metrics()
    vit, other = m.for_model("vit", "1"), m.for_model("other", "1")
    vit.batch_started(3, [0.001, 0.004])
    vit.batch_finished(3, 0.002, ok=True)
    vit.batch_started(5, [0.3])
    vit.batch_finished(5, 0.01, ok=False)
    vit.queue_depth(7)
    vit.queue_depth(2)
    vit.dropped(2)
    vit.dropped(1)
    vit.rejected()
    vit.rejected()
    other.queue_depth(1)

    sizes = histogram(m, "attnserve_batch_size", model="vit", version="1")
    assert (sizes["count"], sizes["sum"]) == (2, 8)
    assert sizes["buckets"] == cumulative(BATCH_BUCKETS, [3, 5])
    waits = histogram(m, "attnserve_queue_wait_seconds", model="vit", version="1")
    assert waits["count"] == 3 and waits["sum"] == pytest.approx(0.305)  # one per request, not per batch
    compute = histogram(m, "attnserve_compute_seconds", model="vit", version="1")
    assert compute["count"] == 2 and compute["sum"] == pytest.approx(0.012)  # failed batches are timed too
    assert value(m, "attnserve_images_total", model="vit", version="1") == 3  # only the batch that succeeded
    assert value(m, "attnserve_failed_batches_total", model="vit", version="1") == 1
    assert value(m, "attnserve_queue_images", model="vit", version="1") == 2  # a gauge: the latest depth
    assert value(m, "attnserve_dropped_requests_total", model="vit", version="1") == 3
    assert value(m, "attnserve_rejected_requests_total", model="vit", version="1") == 2
    # the other model's children exist (bound on creation) but saw nothing but its own depth
    assert value(m, "attnserve_queue_images", model="other", version="1") == 1
    assert value(m, "attnserve_images_total", model="other", version="1") == 0
    assert histogram(m, "attnserve_batch_size", model="other", version="1")["count"] == 0


def test_the_decoder_view_updates_the_translation_metrics():
    m = Metrics()
    d = m.for_decoder("translator", "1")
    d.step(rows=4, seconds=0.003, tokens=4)
    d.step(rows=2, seconds=0.002, tokens=2)
    d.occupancy(running=3, waiting=7)
    d.occupancy(running=1, waiting=0)
    d.finished(tokens=10, seconds=0.05, queue_wait=0.002, first_token=0.01)
    d.finished(tokens=0, seconds=0.02, queue_wait=0.004, first_token=None)  # nothing generated: no first token
    d.cancelled()
    d.rejected()

    assert value(m, "attnserve_generated_tokens_total", model="translator", version="1") == 6
    step = histogram(m, "attnserve_decode_step_seconds", model="translator", version="1")
    assert step["count"] == 2 and step["sum"] == pytest.approx(0.005)
    rows = histogram(m, "attnserve_decode_step_rows", model="translator", version="1")
    assert (rows["count"], rows["sum"]) == (2, 6) and rows["buckets"] == cumulative(BATCH_BUCKETS, [4, 2])
    assert value(m, "attnserve_running_sequences", model="translator", version="1") == 1
    assert value(m, "attnserve_waiting_sequences", model="translator", version="1") == 0
    per_token = histogram(m, "attnserve_time_per_output_token_seconds", model="translator", version="1")
    # 0.05 s / 10 tokens, and 0.02 s / max(1, 0 tokens): never a division by zero
    assert per_token["count"] == 2 and per_token["sum"] == pytest.approx(0.005 + 0.02)
    assert per_token["buckets"] == cumulative(LATENCY_BUCKETS, [0.005, 0.02])
    first = histogram(m, "attnserve_time_to_first_token_seconds", model="translator", version="1")
    assert first["count"] == 1 and first["sum"] == pytest.approx(0.01)
    waits = histogram(m, "attnserve_queue_wait_seconds", model="translator", version="1")  # shared with the classifiers
    assert waits["count"] == 2 and waits["sum"] == pytest.approx(0.006)
    assert value(m, "attnserve_dropped_requests_total", model="translator", version="1") == 1  # a cancelled sentence
    assert value(m, "attnserve_rejected_requests_total", model="translator", version="1") == 1
    # the classifier-only counters stay out
    assert value(m, "attnserve_images_total", model="translator", version="1") is None


def test_the_attention_store_view_sets_its_gauges_and_counts_by_reason_and_operation():
    m = Metrics()
    store = m.for_attention_store()
    store.stored(records=3, nbytes=4096)
    store.stored(records=2, nbytes=1024)
    store.evicted("ttl")
    store.evicted("size", count=4)
    store.evicted("size")
    store.failed("put")
    store.failed("get")
    store.failed("get")
    assert value(m, "attnserve_attention_store_records") == 2
    assert value(m, "attnserve_attention_store_bytes") == 1024
    assert value(m, "attnserve_attention_store_evictions_total", reason="ttl") == 1
    assert value(m, "attnserve_attention_store_evictions_total", reason="size") == 5
    assert value(m, "attnserve_attention_store_failures_total", operation="put") == 1
    assert value(m, "attnserve_attention_store_failures_total", operation="get") == 2


def test_the_model_gauges_are_labelled_by_model_version_and_provider():
    m = Metrics()
    m.provider.labels("vit", "1", "CPUExecutionProvider").set(1)
    m.ready.labels("vit", "1").set(1)
    m.ready.labels("translator", "1").set(0)
    assert value(m, "attnserve_model_provider_info", model="vit", version="1", provider="CPUExecutionProvider") == 1
    assert value(m, "attnserve_model_ready", model="vit", version="1") == 1
    assert value(m, "attnserve_model_ready", model="translator", version="1") == 0
