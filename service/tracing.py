"""OpenTelemetry traces, off unless the standard ``OTEL_*`` variables ask for them.

On when ``OTEL_TRACES_EXPORTER`` names ``otlp`` or ``console``, or when it is unset and an OTLP endpoint is
(``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``); ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` keeps them off. The exporter follows
``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL``: ``grpc``, or ``http/protobuf`` (the default); the OpenTelemetry
SDK reads the rest (endpoint, headers, timeout, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, the
batch processor's ``OTEL_BSP_*``, the sampler's ``OTEL_TRACES_SAMPLER``) as it documents them.

What a request shows (HTTP and gRPC alike, its W3C ``traceparent`` continued when it brings one, and the
server span's sent back in the ``traceparent`` response header or trailing metadata):

- its server span (route, status, request id, key fingerprint);
- for a translation, per sentence: ``queue`` (waiting for a decoding lane) and ``decode`` (its steps), the
  latter linked to every ``decode hop`` it shared: a hop is a span of its own (its lane, the rows and
  requests it stepped, its steps), linked back to each request in it;
- for a classification: ``queue`` and ``classify batch`` (the batch's rows and requests), linked both ways
  likewise;
- ``attention store``, when it keeps maps.

Off, none of this runs: each hook tests one attribute.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

log = logging.getLogger("attnserve.tracing")

TRACEPARENT = "traceparent"
_NS = 1_000_000_000


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()}
    if exporters:
        return bool(exporters & {"otlp", "console"})
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


class Tracing:
    """The process's tracer (``enabled`` False: every method is a no-op the hooks never call)."""

    def __init__(self) -> None:
        self.enabled = False
        self._tracer: Any = None
        self._propagator: Any = None
        self._provider: Any = None
        self._offset_ns = time.time_ns() - time.perf_counter_ns()  # perf_counter() seconds -> epoch ns
        self._next_warning = 0.0

    def configure(self, version: str, env: Mapping[str, str] = os.environ) -> None:
        """Start exporting if the environment asks (once per process; later calls change nothing)."""
        if self.enabled or not wanted(env):
            return
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
        resource = Resource.create(
            {"service.name": env.get("OTEL_SERVICE_NAME", "attnserve"), "service.version": version}
        )
        provider = TracerProvider(resource=resource)
        protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
        if "otlp" in exporters:
            if protocol.strip() == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        if "console" in exporters:
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._provider, self._tracer = provider, provider.get_tracer("attnserve", version)
        self._propagator = TraceContextTextMapPropagator()
        self.enabled = True
        log.info("traces on: OTLP over %s", "gRPC" if protocol.strip() == "grpc" else "HTTP")
        # the API's global provider is left alone: these spans are the service's own

    def flush(self) -> None:
        """Export what is buffered (as the service stops)."""
        if self._provider is not None:
            self._provider.force_flush()

    # ---- request spans --------------------------------------------------------------------------
    @contextlib.contextmanager
    def server_span(self, name: str, traceparent: str | None, attributes: dict[str, Any]) -> Iterator[Any]:
        """A request's span, continuing ``traceparent`` when it is a valid one; current inside the block."""
        from opentelemetry import trace

        parent = self._propagator.extract({TRACEPARENT: traceparent}) if traceparent else None
        with self._tracer.start_as_current_span(
            name, context=parent, kind=trace.SpanKind.SERVER, attributes=attributes, end_on_exit=True
        ) as span:
            yield span

    @staticmethod
    def traceparent(span: Any) -> str:
        """The W3C ``traceparent`` of ``span``."""
        c = span.get_span_context()
        return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"

    @staticmethod
    def current() -> Any:
        """The current span's context (captured when work is queued), or None."""
        from opentelemetry import trace

        c = trace.get_current_span().get_span_context()
        return c if c.is_valid else None

    @contextlib.contextmanager
    def span(self, name: str, attributes: dict[str, Any] | None = None) -> Iterator[Any]:
        """A child of the current span (the attention store's write)."""
        with self._tracer.start_as_current_span(name, attributes=attributes or {}) as s:
            yield s

    # ---- spans recorded afterwards, from perf_counter() times -----------------------------------
    @contextlib.contextmanager
    def guarded(self) -> Iterator[None]:
        """Around recording spans on an engine's path: a failure there is logged (once a minute), never raised
        into the engine."""
        try:
            yield
        except Exception:
            if time.monotonic() >= self._next_warning:
                log.exception("traces: recording spans failed; the requests are served, their spans may be missing")
                self._next_warning = time.monotonic() + 60

    def shared(self, name: str, start: float, end: float, members: Sequence[Any], attributes: dict[str, Any]) -> Any:
        """A span of work several requests shared (a decoding hop, a classification batch), linked to each
        member's context (None: untraced); returns its context, for their own spans to link back."""
        from opentelemetry.trace import Link

        unique = {(m.trace_id, m.span_id): m for m in members if m is not None}  # a request's sentences: one link
        links = [Link(m) for m in unique.values()]
        s = self._tracer.start_span(name, links=links, attributes=attributes, start_time=self._ns(start))
        s.end(end_time=self._ns(end))
        return s.get_span_context()

    def child(
        self, parent: Any, name: str, start: float, end: float, links: Sequence[Any] = (), attributes=None
    ) -> None:
        """A span of ``parent`` (a request's context) from ``start`` to ``end``, linked to ``links``."""
        from opentelemetry import trace
        from opentelemetry.trace import Link

        ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent))
        s = self._tracer.start_span(
            name, context=ctx, links=[Link(c) for c in links], attributes=attributes or {}, start_time=self._ns(start)
        )
        s.end(end_time=self._ns(end))

    def hop(self, model: str, lane: int, steps: int, started: float, members: Sequence[Any], done: Sequence[Any]):
        """A decoding lane's hop (``service/engine/scheduler.py``): its span, linked to the requests it stepped
        (``members``, tickets), and the spans of those that finished in it (``done``): ``queue``, and ``decode``
        linked to each hop the sentence was stepped in."""
        attributes = {
            "attnserve.model": model,
            "attnserve.lane": lane,
            "attnserve.rows": sum(t.request.beam for t in members),
            "attnserve.requests": len(members),
            "attnserve.steps": steps,
        }
        hop = self.shared("decode hop", started, time.perf_counter(), [t.trace for t in members], attributes)
        for t in members:
            t.hops.append(hop)
        for t in done:
            begun = t.started_at or t.enqueued_at
            self.child(t.trace, "queue", t.enqueued_at, begun, attributes={"attnserve.priority": t.priority})
            self.child(t.trace, "decode", begun, t.finished_at or begun, t.hops, {"attnserve.hops": len(t.hops)})

    def _ns(self, perf_seconds: float) -> int:
        return self._offset_ns + int(perf_seconds * _NS)


TRACING = Tracing()  # the process's: traces are configured once, from the environment, by create_app
