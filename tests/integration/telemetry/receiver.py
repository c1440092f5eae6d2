"""A real OTLP/HTTP trace receiver for tests: POST /v1/traces on 127.0.0.1, each request
decoded with the official protobuf definitions (opentelemetry-proto), never the SDK's
in-memory exporter, so what the tests see is what left the processes on the wire."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


@dataclass(frozen=True)
class Link:
    trace_id: str
    span_id: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class Span:
    """One received span, decoded: ids as hex, attributes as plain values."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    links: tuple[Link, ...]
    events: tuple[tuple[str, dict[str, Any]], ...]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    start_ns: int


@dataclass
class Received:
    spans: list[Span] = field(default_factory=list)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def named(self, prefix: str) -> list[Span]:
        with self.lock:
            return sorted(
                (s for s in self.spans if s.name.startswith(prefix)), key=lambda s: s.start_ns
            )


def _decode(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for rs in request.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                spans.append(
                    Span(
                        service=str(resource.get("service.name", "")),
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        links=tuple(
                            Link(
                                lk.trace_id.hex(),
                                lk.span_id.hex(),
                                {a.key: _value(a.value) for a in lk.attributes},
                            )
                            for lk in s.links
                        ),
                        events=tuple(
                            (e.name, {a.key: _value(a.value) for a in e.attributes})
                            for e in s.events
                        ),
                        status_code=s.status.code,
                        status_message=s.status.message,
                        start_ns=s.start_time_unix_nano,
                    )
                )
    return spans


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    """Serve OTLP/HTTP on 127.0.0.1:<ephemeral>; yields (endpoint, what was received)."""
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            spans = _decode(body)
            with received.lock:
                received.spans.extend(spans)
                received.requests += 1
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = False
    server.block_on_close = True
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
