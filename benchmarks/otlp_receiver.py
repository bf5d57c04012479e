"""An OTLP trace receiver built from the ``opentelemetry-proto`` messages, for ``bench_tracing`` and the tests:
OTLP/HTTP (``POST /v1/traces``, binary protobuf) and OTLP/gRPC (``TraceService/Export``), keeping every span it
is sent (``keep=False``: counting them only)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from benchmarks.bench_classify import _free_port as free_port


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent: str
    links: list[tuple[str, str]]  # (trace id, span id)
    attributes: dict[str, object]
    start_ns: int
    end_ns: int
    service: str


def _value(v) -> object:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class Receiver:
    """Both transports on free ports of 127.0.0.1; ``spans`` grows as exports arrive."""

    def __init__(self, keep: bool = True) -> None:
        self.spans: list[Span] = []
        self.exports = {"http": 0, "grpc": 0}
        self.received = 0  # spans
        self._keeps = keep
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver._keep(trace_service_pb2.ExportTraceServiceRequest.FromString(body), "http")
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                receiver._keep(request, "grpc")
                return trace_service_pb2.ExportTraceServiceResponse()

        self.http_port, self.grpc_port = free_port(), free_port()
        self._http = ThreadingHTTPServer(("127.0.0.1", self.http_port), Handler)
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        self._grpc = grpc.server(futures.ThreadPoolExecutor(2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._grpc)
        self._grpc.add_insecure_port(f"127.0.0.1:{self.grpc_port}")
        self._grpc.start()

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    def _keep(self, request, transport: str) -> None:
        if not self._keeps:
            with self._lock:
                self.received += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
                self.exports[transport] += 1
            return
        spans = []
        for rs in request.resource_spans:
            service = next((_value(a.value) for a in rs.resource.attributes if a.key == "service.name"), "")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(
                        Span(
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            [(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                            {a.key: _value(a.value) for a in s.attributes},
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                            str(service),
                        )
                    )
        with self._lock:
            self.spans += spans
            self.received += len(spans)
            self.exports[transport] += 1

    def wait_for(self, found: Callable[[list[Span]], bool], timeout: float = 20.0) -> list[Span]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                spans = list(self.spans)
            if found(spans):
                return spans
            time.sleep(0.05)
        raise AssertionError(f"the spans wanted never came; {len(spans)} came: {[s.name for s in spans]}")

    def stop(self) -> None:
        self._http.shutdown()
        self._grpc.stop(0)
