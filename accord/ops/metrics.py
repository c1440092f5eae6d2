"""`/metrics` in Prometheus format: the status figures on every scrape, plus messaging metrics,
the process's flow counters (accord.observe) and `/healthz` / `/readyz` (accord.ops.health).

``StatusCollector`` takes one ``collect_status`` snapshot per scrape and yields it as gauges
(and the replay-refusal ledger, which only grows, as a counter), so `/metrics` and `accord
status` show the same numbers. A scrape runs on the HTTP server's own thread with its own
short-lived event loop and connection: scraping never blocks the process's event loop, and
the process's loop never delays a scrape. A database that does not answer turns into
``accord_status_up 0``, never into stale figures.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from threading import Thread
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import anyio
import asyncpg
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from accord import observe
from accord.ops.health import Readiness, routes
from accord.ops.messaging import MessagingMetrics
from accord.ops.models import REPORTED_STATES, StatusReport
from accord.ops.status import collect_status
from accord.schemas.db import DB_CONNECTION_LOST, connect
from accord.schemas.errors import ConfigError, ServiceRefused

#: What a scrape maps to ``accord_status_up 0``: the database is unreachable or refused (a
#: refused login or a missing database too: a scrape that failed whole would leave the alert
#: on ``accord_status_up == 0`` silent, and the process's own families with it).
UNAVAILABLE: tuple[type[BaseException], ...] = (
    *DB_CONNECTION_LOST,
    asyncpg.PostgresError,
    ServiceRefused,
)

Source = Callable[[], StatusReport]


def _gauge(name: str, doc: str, labels: Sequence[str], rows: Any) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for *values, number in rows:
        family.add_metric([str(v) for v in values], float(number))
    return family


def families(report: StatusReport) -> list[Metric]:
    """The report as metric families (pure; the collector and the tests call it)."""
    r = report
    sw = ["state", "tenant", "workflow"]
    wait = ["category", "reason", "state", "tenant", "workflow"]
    eff = ["tenant", "workflow", "effect_state", "job_state"]
    # Every reported state appears (0 when empty) so an alert on a state never sees a gap.
    totals = [(s, r.count(s)) for s in REPORTED_STATES]
    refusals = CounterMetricFamily(
        "accord_replay_refusals",
        "Replay events not applied, by reason: refused under the projection principal, refused"
        " by PostgreSQL for their content, or no longer decodable (0064)",
        labels=["workflow", "reason"],
    )  # fmt: skip
    for x in r.replay_refusals:
        refusals.add_metric([x.workflow, x.reason], float(x.refusals))
    return [
        _gauge("accord_jobs", "Jobs by state, tenant and workflow class", sw,
               [(g.state, g.tenant, g.workflow, g.jobs) for g in r.jobs]),
        _gauge("accord_jobs_by_state", "Jobs by state (all tenants and classes)", ["state"],
               totals),
        _gauge("accord_jobs_oldest_age_seconds", "Age of the oldest job in the group", sw,
               [(g.state, g.tenant, g.workflow, g.oldest_age_s) for g in r.jobs]),
        _gauge("accord_job_attempts", "Claims made so far of the group's jobs", sw,
               [(g.state, g.tenant, g.workflow, g.attempts) for g in r.jobs]),
        _gauge("accord_jobs_rescued", "Jobs whose last return was a rescue", sw,
               [(g.state, g.tenant, g.workflow, g.rescued) for g in r.jobs]),
        _gauge("accord_waiting_jobs", "Waiting jobs by typed reason", wait,
               [(w.category, w.reason, w.state, w.tenant, w.workflow, w.jobs)
                for w in r.waiting]),
        _gauge("accord_waiting_oldest_age_seconds", "Age of the oldest waiting job", wait,
               [(w.category, w.reason, w.state, w.tenant, w.workflow, w.oldest_age_s)
                for w in r.waiting]),
        _gauge("accord_unresolved_effects", "Effects whose outcome is not known", eff,
               [(e.tenant, e.workflow, e.effect_state, e.job_state, e.effects)
                for e in r.effects]),
        _gauge("accord_unresolved_effect_oldest_age_seconds", "Age of the oldest such effect",
               eff, [(e.tenant, e.workflow, e.effect_state, e.job_state, e.oldest_age_s)
                     for e in r.effects]),
        _gauge("accord_unresolved_effects_escalated", "Of those, escalated to a human", eff,
               [(e.tenant, e.workflow, e.effect_state, e.job_state, e.escalated)
                for e in r.effects]),
        _gauge("accord_escalated_effects", "Unknown effects escalated to a human", [],
               [(r.escalated_effects,)]),
        _gauge("accord_tenant_epoch", "Authority epoch", ["tenant"],
               [(t.tenant, t.epoch) for t in r.tenants]),
        _gauge("accord_tenant_frozen", "1 when the tenant's authority is frozen", ["tenant"],
               [(t.tenant, int(t.frozen)) for t in r.tenants]),
        _gauge("accord_tenant_held_jobs", "Jobs held (old epoch or frozen authority)",
               ["tenant"], [(t.tenant, t.held) for t in r.tenants]),
        _gauge("accord_tenant_restore_detected", "1 while a restore detection is open",
               ["tenant"], [(t.tenant, int(t.restore_ledger_epoch is not None))
                            for t in r.tenants]),
        _gauge("accord_journal_evidence",
               "Begins a worker's journal holds that the database has no record of (a"
               " restore's evidence), not yet acknowledged", ["tenant"],
               sorted(Counter(v.tenant for v in r.journal_evidence).items())),
        _gauge("accord_workflow_live_leases", "Unexpired leases (worker evidence)",
               ["workflow"], [(w.workflow, w.live_leases) for w in r.workflows]),
        _gauge("accord_workflow_effects_enabled", "1 when the class may run effects",
               ["workflow"], [(w.workflow, int(w.effects_enabled)) for w in r.workflows]),
        _gauge("accord_relay_pending", "Outbox rows not yet published", [],
               [(r.relay.pending,)]),
        _gauge("accord_relay_held", "Outbox rows held for a permanent failure", [],
               [(r.relay.held,)]),
        _gauge("accord_relay_lag_seconds", "Age of the oldest unpublished outbox row", [],
               [(r.relay.lag_s,)]),
        _gauge("accord_relay_pending_attempts", "Publish attempts of unpublished rows", [],
               [(r.relay.pending_attempts,)]),
        _gauge("accord_relay_awake_seconds",
               "Seconds left on a relay's promise to poll (enqueues skip NOTIFY meanwhile)", [],
               [(r.relay.awake_s,)]),
        _gauge("accord_relay_held_rows", "Held outbox rows by typed reason", ["reason"],
               [(h.reason, h.rows) for h in r.relay_held]),
        _gauge("accord_inbox_conflicts", "Inbox conflicts (retained deliveries)", [],
               [(r.inbox_conflicts,)]),
        _gauge("accord_poison_messages", "Poison records by consumer and typed reason",
               ["consumer", "reason"],
               [(p.consumer, p.reason, p.messages) for p in r.poison]),
        _gauge("accord_poison_oldest_age_seconds", "Age of the oldest poison record",
               ["consumer", "reason"],
               [(p.consumer, p.reason, p.oldest_age_s) for p in r.poison]),
        _gauge("accord_replay_horizon_seconds",
               "A consumer's declared replay window plus its prune margin: no retention of"
               " jobs or poison records may be shorter", ["consumer"],
               [(w.consumer, w.horizon_s) for w in r.replay_windows]),
        refusals,
    ]  # fmt: skip


class StatusCollector(Collector):
    """A custom collector: one status snapshot per scrape."""

    def __init__(self, source: Source) -> None:
        self._source = source

    @classmethod
    def from_dsn(cls, dsn: str, *, timeout_s: float = 10.0) -> StatusCollector:
        """Each scrape: a fresh connection, one snapshot, closed again (from any thread)."""

        async def snapshot() -> StatusReport:
            with anyio.fail_after(timeout_s):
                conn = await connect(dsn, timeout=timeout_s)
                try:
                    return await collect_status(conn, integrity=False, window=False)
                finally:
                    await conn.close()

        return cls(lambda: anyio.run(snapshot))

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        try:
            report = self._source()
        except UNAVAILABLE:
            up = 0.0
            found: list[Metric] = []
        else:
            up = 1.0
            found = families(report)
        yield from found
        yield GaugeMetricFamily(
            "accord_status_up", "1 when the last scrape read the database", value=up
        )
        yield GaugeMetricFamily(
            "accord_status_scrape_seconds", "Time the status snapshot took",
            value=time.perf_counter() - started,
        )  # fmt: skip


class ProcessCollector(Collector):
    """The process's own figures: the flow counters and histograms the loops feed
    (accord.observe), how overdue each loop's beat is, and the last readiness round."""

    def __init__(self, readiness: Readiness | None) -> None:
        self._readiness = readiness

    def collect(self) -> Iterator[Metric]:
        yield from observe.REGISTRY.collect()
        stuck = GaugeMetricFamily(
            "accord_loops_stuck", "Loops overdue past their beat and the grace", labels=["loop"]
        )
        for s in observe.LIVENESS.stuck():
            stuck.add_metric([s.loop], 1.0)
        yield stuck
        yield GaugeMetricFamily(
            "accord_loops_alive", "Loops beating in this process",
            value=len(observe.LIVENESS.loops()),
        )  # fmt: skip
        if self._readiness is not None:
            ready = GaugeMetricFamily(
                "accord_ready",
                "1 when the readiness check passed (startup: the process has started and its"
                " checks have run once)",
                labels=["check"],
            )
            failing = self._readiness.failing()
            for name in ["startup", *(name for name, _ in self._readiness.checks)]:
                ready.add_metric([name], float(name not in failing))
            yield ready


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log on stderr (a probe every second would drown the process's logs)."""


@dataclass
class MetricsServer:
    """A running `/metrics` endpoint (a daemon thread); ``close()`` stops it."""

    registry: CollectorRegistry
    messaging: MessagingMetrics
    port: int
    _server: WSGIServer
    _thread: Thread
    readiness: Readiness | None = None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self.messaging.shutdown()
        if self.readiness is not None:
            self.readiness.close()


def serve_metrics(
    port: int,
    *,
    dsn: str | None,
    addr: str = "127.0.0.1",
    timeout_s: float = 10.0,
    readiness: Readiness | None = None,
) -> MetricsServer:
    """Start `/metrics`, `/healthz` and `/readyz` on ``addr:port`` (0: an ephemeral port; see
    ``MetricsServer.port``).

    With a ``dsn`` every scrape includes the status figures; the OpenTelemetry messaging
    metrics are always there (feed them with ``install_span_metrics(server.messaging)``), and
    so are the process's flow counters. ``readiness`` (started here) answers `/readyz`;
    without it `/readyz` is 200 whenever the server answers.
    """
    registry = CollectorRegistry()
    messaging = MessagingMetrics(registry)
    if dsn is not None:
        registry.register(StatusCollector.from_dsn(dsn, timeout_s=timeout_s))
    registry.register(ProcessCollector(readiness))
    app = routes(make_wsgi_app(registry), readiness)
    try:
        server = make_server(addr, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
    except OSError as exc:  # in use, an address this host does not have, a privileged port
        messaging.shutdown()
        raise ConfigError(
            "the metrics address cannot be bound: another process holds the port, or the"
            " address is not this host's; choose another ACCORD_METRICS_PORT (0: any free"
            " port) or metrics address",
            addr=addr,
            port=port,
            detail=str(exc),
        ) from None
    if readiness is not None:
        readiness.start()
    thread = Thread(target=server.serve_forever, name="accord-metrics", daemon=True)
    thread.start()
    return MetricsServer(registry, messaging, server.server_address[1], server, thread, readiness)


@contextmanager
def serving(
    port: int, *, dsn: str | None, addr: str = "127.0.0.1", readiness: Readiness | None = None
) -> Iterator[MetricsServer]:
    """``serve_metrics`` for the length of a block (long-running processes use this)."""
    server = serve_metrics(port, dsn=dsn, addr=addr, readiness=readiness)
    try:
        yield server
    finally:
        server.close()
