"""Tracing setup for every accord process, from the standard OpenTelemetry environment.

The composition root's one call: ``configure()`` reads nothing accord-specific. With
``OTEL_TRACES_EXPORTER`` unset or ``none`` it installs nothing, so every tracer stays the
API's no-op proxy and a span costs next to nothing. With ``otlp`` it installs an SDK
``TracerProvider`` whose resource is ``Resource.create()`` (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``), whose sampler is the SDK's own from ``OTEL_TRACES_SAMPLER``
(and ``_ARG``), exporting through a ``BatchSpanProcessor`` (``OTEL_BSP_*``) to the official
OTLP exporter (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
headers, timeout: read by the exporter itself). ``OTEL_EXPORTER_OTLP_PROTOCOL`` (or its
``_TRACES_`` form) chooses ``http/protobuf`` (the default, the one installed with accord) or
``grpc`` (needs ``opentelemetry-exporter-otlp-proto-grpc``). The processor is shut down at
exit (``atexit``, and by ``tracing()`` when the process's main returns), so the last spans
leave before the process does.

An application's own producer process calls ``accord.telemetry.configure()`` once at start;
from then on ``enqueue`` records its ``create`` span and stores its context with the row.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.environment_variables import OTEL_TRACES_EXPORTER
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from accord.errors import SettingsInvalid

__all__ = ["configure", "shutdown", "tracing"]

_installed: list[SpanProcessor] = []


def configure(environ: Mapping[str, str] | None = None) -> bool:
    """Install tracing from the ``OTEL_*`` environment, once per process; returns whether
    spans are exported. Idempotent: a second call changes nothing. Raises SettingsInvalid
    for an exporter or protocol accord cannot provide (one line naming the variable)."""
    env = os.environ if environ is None else environ
    if _installed:
        return True
    names = [n.strip() for n in env.get(OTEL_TRACES_EXPORTER, "").split(",") if n.strip()]
    if not names or names == ["none"]:
        return False
    processors = [BatchSpanProcessor(_exporter(name, env)) for name in names if name != "none"]
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        # Already installed in this process (span metrics start one when /metrics is
        # served): its resource and sampler came from the same environment.
        provider = current
    else:
        provider = TracerProvider(resource=Resource.create())  # sampler: OTEL_TRACES_SAMPLER
        trace.set_tracer_provider(provider)
    for processor in processors:
        provider.add_span_processor(processor)
    _installed.extend(processors)
    atexit.register(shutdown)
    return True


def shutdown() -> None:
    """Flush and stop the exporters ``configure`` installed (a no-op when none or done)."""
    while _installed:
        _installed.pop().shutdown()  # BatchSpanProcessor.shutdown exports what is queued


@contextmanager
def tracing() -> Iterator[bool]:
    """``configure()`` for the length of a process's main; flushes when it returns."""
    exporting = configure()
    try:
        yield exporting
    finally:
        shutdown()


def _exporter(name: str, env: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise SettingsInvalid(
            f"{OTEL_TRACES_EXPORTER}: {name!r} is not an exporter accord provides"
            " (otlp, console or none)"
        )
    protocol = env.get(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL) or env.get(
        OTEL_EXPORTER_OTLP_PROTOCOL, "http/protobuf"
    )
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            raise SettingsInvalid(
                f"{OTEL_EXPORTER_OTLP_PROTOCOL}: grpc needs opentelemetry-exporter-otlp-proto-grpc"
                " installed"
            ) from None
        exporter: SpanExporter = GrpcExporter()
        return exporter
    raise SettingsInvalid(
        f"{OTEL_EXPORTER_OTLP_PROTOCOL}: {protocol!r} is not an OTLP protocol"
        " (http/protobuf or grpc)"
    )
