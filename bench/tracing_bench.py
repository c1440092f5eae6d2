"""What tracing costs on the relay's and the consumer's per-message path.

    .venv/bin/python -m bench.tracing_bench [--messages 20000] [--rounds 3]

The real code runs, without a broker or a database so that only the message path is
measured: the relay's ``_publish_one`` (the publish span with its link to ``create``, the
CloudEvents encoding) into a publisher that confirms at once, then the consumer's
``BatchProcessor.admit`` on that very message (the process span, the strict parse, the
catalog's validation and digest) and the span's end, as a batch does. Each mode runs in a
fresh process, configured only by OTEL_* variables: ``none`` (OTEL_TRACES_EXPORTER unset:
the no-op proxy tracer) and ``otlp`` (OTEL_TRACES_EXPORTER=otlp, http/protobuf, a
BatchSpanProcessor exporting to an OTLP/HTTP receiver this bench starts on 127.0.0.1).
Prints messages/second for each (the median of the rounds), their ratio, and the spans the
receiver got.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio

CREATE_CONTEXT = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}


class _NullPublisher:
    """Confirms every publish at once (the broker is not what is measured)."""

    def __init__(self) -> None:
        self.last: Any = None

    async def publish(self, message: Any, *, confirm_timeout_s: float) -> None:
        self.last = message

    def broken(self) -> bool:
        return False

    async def writable(self) -> None:
        return None


class _Incoming:
    """The fields of an aio-pika incoming message that ``admit`` reads."""

    def __init__(self, wire: Any, tag: int) -> None:
        self.body = wire.body
        self.headers = dict(wire.headers)
        self.routing_key = wire.routing_key
        self.message_id = wire.message_id
        self.content_type = wire.content_type
        self.redelivered = False
        self.delivery_tag = tag


async def _path(messages: int) -> float:
    """Messages per second through publish span + process span, the real code."""
    from accord import telemetry
    from accord.consumers.batch import BatchProcessor
    from accord.consumers.handlers import Handlers
    from accord.consumers.inbox import Consumer
    from accord.demo.catalog import demo_catalog
    from accord.relay import Relay, RelayConfig
    from accord.relay.outbox import OutboxRow
    from accord.schemas.events import Event, encode_payload
    from accord.schemas.telemetry import tracer

    telemetry.configure()
    catalog = demo_catalog()
    relay = Relay(RelayConfig(pg_dsn="postgresql://unused", amqp_url="amqp://unused", exchange="x"))
    handlers = Handlers("report")

    async def handle(tx: Any, event: Event) -> None:
        return None

    handlers.register("report.accepted", 1, handle)
    processor = BatchProcessor(
        consumer=Consumer("report", catalog, 3600.0),
        handlers=handlers,
        tenants=frozenset({"*"}),
        queue="bench.wf.report",
        delivery_limit=5,
        tracer=tracer(),
    )
    publisher = _NullPublisher()
    rows = []
    for i in range(messages):
        event = Event(
            tenant="acme",
            operation_id=f"report:{i}",
            type="report.accepted",
            version=1,
            authority_epoch=0,
            payload={"report_id": str(i), "subject": "quarterly figures"},
            event_id=uuid.uuid4(),
        )
        body = encode_payload(event, 1 << 20)
        rows.append(OutboxRow(i, event, catalog.digest(event), body, CREATE_CONTEXT, 1))
    outcomes: list[Any] = []
    started = time.perf_counter()
    for i, row in enumerate(rows):
        await relay._publish_one(publisher, row, outcomes)
        item = processor.admit(_Incoming(publisher.last, i + 1))  # type: ignore[arg-type]
        item.span.end()
    elapsed = time.perf_counter() - started
    assert len(outcomes) == messages and item.permanent is None, item.permanent
    telemetry.shutdown()
    return messages / elapsed


def _child(messages: int) -> None:
    rate = anyio.run(_path, messages)
    print(json.dumps({"rate": rate}))


class _Receiver:
    """A local OTLP/HTTP endpoint that accepts every export and counts the bytes."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.requests += 1
                receiver.bytes += len(body)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _run(mode: str, messages: int, endpoint: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if mode == "otlp":
        env.update(
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_SERVICE_NAME="tracing-bench",
        )
    done = subprocess.run(
        [sys.executable, "-m", "bench.tracing_bench", "--child", "--messages", str(messages)],
        env=env,
        capture_output=True,
        check=True,
    )
    rate: float = json.loads(done.stdout.decode().strip().splitlines()[-1])["rate"]
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.messages)
        return
    rates: dict[str, list[float]] = {"none": [], "otlp": []}
    receiver = _Receiver()
    with receiver as endpoint:
        for _ in range(args.rounds):
            for mode in ("none", "otlp"):  # interleaved: drift hits both alike
                rates[mode].append(_run(mode, args.messages, endpoint))
    none, otlp = statistics.median(rates["none"]), statistics.median(rates["otlp"])
    print(f"tracing bench: {args.messages} messages x {args.rounds} rounds (median)")
    print(f"  no exporter (no-op tracer)      {none:10.0f} msg/s  (publish + process span code)")
    print(f"  OTLP exporter (http/protobuf)   {otlp:10.0f} msg/s  ({2 * otlp:.0f} spans/s)")
    print(f"  ratio with/without              {otlp / none:10.2f}")
    print(f"  receiver: {receiver.requests} export requests, {receiver.bytes} bytes")


if __name__ == "__main__":
    main()
