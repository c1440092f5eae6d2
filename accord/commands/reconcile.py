"""`accord reconcile`: resolve unknown effects with their providers' evidence, one pass.

Runs as the repair role (see `accord repair`). For each effect needing reconciliation it
asks only the provider the application declares as the owner of the effect's key, for the
receipt of the effect's idempotency key (the same key the runner sent:
jobs.runner.effects.idempotency_key); an effect whose key no provider owns, or whose owner
offers no lookup, or whose job class the application does not declare, is not asked about.
A receipt resolves it to ``succeeded``; a
definite "never seen", ``reconcile_settle_s`` after the job's attempts could last have sent
(``jobs.reconciliation.quiet_since``: past every lease the job granted), resolves it to
``failed_before_dispatch`` (the job may run again); anything else leaves it unknown. A
resolution that leaves the job with every effect outcome known (one succeeded) also resumes
it (`accord repair resume`, audited, the provider's answer as evidence): its next run reuses
the recorded receipt and publishes. What no lookup may answer, a person resolves with `accord
repair resolve-effect`. Either way, effects unresolved for longer than
``effect_escalate_after_s`` are escalated, never resolved by time.

Exit 0: the pass asked what it could and every provider asked answered; 1: a provider gave no
answer (``why=lookup_unavailable``: run it again later); 2: refused (settings, database).
"""

from __future__ import annotations

import argparse
import logging
import uuid
from typing import Any

from opentelemetry.trace import Status, StatusCode

from accord import runtime
from accord.app import App, ReceiptLookup
from accord.commands import args
from accord.commands.common import require_app
from accord.commands.repair import repair_connection
from accord.jobs import reconcile
from accord.jobs import sql as jobs_sql
from accord.jobs.errors import LookupUnavailable
from accord.jobs.models import Lease
from accord.jobs.runner.effects import idempotency_key
from accord.schemas import telemetry
from accord.schemas.settings import Settings

log = logging.getLogger("accord.reconcile")


def effect_idempotency_key(effect: reconcile.UnresolvedEffect) -> str:
    """The provider idempotency key the runner used for this effect (tenant, workflow class,
    operation id and effect key only: the other lease fields do not enter it)."""
    lease = Lease(
        job_id=effect.job_id,
        tenant=effect.tenant,
        workflow=effect.workflow,
        operation_id=effect.operation_id,
        owner="reconcile",
        attempt_id=uuid.UUID(int=0),
        generation=effect.generation,
        epoch=0,
        lease_expires_at=effect.begun_at,
    )
    return idempotency_key(lease, effect.effect_key)


def asking(provider: str, receipt_lookup: ReceiptLookup) -> reconcile.Lookup:
    """A reconcile lookup over ``provider``'s receipt lookup by idempotency key. Any failure
    of the lookup is "no definite answer" (LookupUnavailable), never evidence."""

    async def lookup(effect: reconcile.UnresolvedEffect) -> reconcile.Answer:
        key = effect_idempotency_key(effect)
        try:
            receipt = await receipt_lookup(key)
        except Exception as exc:
            # The type only (accord.logs): a provider's error text may quote a request.
            log.warning(
                "provider %s gave no answer for key %s (%s)", provider, key, type(exc).__name__
            )
            raise LookupUnavailable(job_id=effect.job_id, key=key) from exc
        if receipt is None:
            return reconcile.Answer(None, f"{provider}: key {key} never accepted")
        return reconcile.Answer(receipt.receipt_id, f"{provider}: {receipt.evidence}")

    return lookup


def lookups(app: App) -> reconcile.LookupFor:
    """Each effect to the lookup of the provider that owns its key, or to none."""
    by_provider = {p.name: asking(p.name, p.lookup) for p in app.providers if p.lookup}

    def lookup_for(effect: reconcile.UnresolvedEffect) -> reconcile.Lookup | None:
        if effect.workflow not in app.jobs:
            return None  # not this application's work: nothing here is its evidence
        owner = app.owner_of(effect.effect_key)
        return None if owner is None else by_provider.get(owner.name)

    return lookup_for


def noting_keys(
    lookup_for: reconcile.LookupFor, asked: dict[tuple[int, str, int], str]
) -> reconcile.LookupFor:
    """``lookup_for``, noting the idempotency key of each effect it gives a lookup (for the
    resolution spans)."""

    def noted(effect: reconcile.UnresolvedEffect) -> reconcile.Lookup | None:
        lookup = lookup_for(effect)
        if lookup is not None:
            asked[(effect.job_id, effect.effect_key, effect.seq)] = effect_idempotency_key(effect)
        return lookup

    return noted


async def trace_resolutions(
    conn: Any, report: reconcile.ReconcileReport, asked: dict[tuple[int, str, int], str]
) -> None:
    """One ``reconcile`` span per resolution, in the operation's trace: a child of the span
    that submitted the job (its stored context, as every attempt is), linked to it, naming
    the effect it resolved (job, key, seq, idempotency key) and the outcome. A resolution that
    leaves the job unknown (or failed) is the operation's terminal word: an error."""
    if not report.resolved or not telemetry.exporting():
        return
    rows = await conn.fetch(jobs_sql.JOB_TRACES, sorted({done.job_id for done in report.resolved}))
    stored = {row["job_id"]: telemetry.carrier_from_json(row["trace"]) for row in rows}
    tracer = telemetry.tracer()
    for done in report.resolved:
        carrier = stored.get(done.job_id)
        attributes: dict[str, Any] = {
            telemetry.ATTR_JOB_ID: done.job_id,
            telemetry.ATTR_EFFECT_KEY: done.effect_key,
            telemetry.ATTR_EFFECT_SEQ: done.seq,
            telemetry.ATTR_EFFECT_OUTCOME: str(done.outcome),
            telemetry.ATTR_RECONCILE_JOB_STATE: str(done.job_state),
        }
        key = asked.get((done.job_id, done.effect_key, done.seq))
        if key is not None:
            attributes[telemetry.ATTR_IDEMPOTENCY_KEY] = key
        effect = telemetry.carrier_from_json(
            await conn.fetchval(jobs_sql.EFFECT_TRACE, done.job_id, done.effect_key, done.seq)
        )
        span = tracer.start_span(
            f"reconcile {done.effect_key}",
            context=telemetry.parent_from(carrier),
            # the effect span it resolves (kept by the runner while tracing), else the job's
            links=telemetry.links_from(effect or carrier, "resolves"),
            attributes=attributes,
        )
        # failed: the job's handler gave up for good, whatever the answer (0055); else a
        # receipt is no error (the job is resumed), any other outcome on a terminal state is.
        if str(done.job_state) == "failed" or (
            str(done.job_state) in telemetry.TERMINAL_JOB_STATES
            and str(done.outcome) != "succeeded"
        ):
            span.set_status(Status(StatusCode.ERROR, str(done.outcome)))
        span.end()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "reconcile", help="resolve unknown effects with provider evidence", description=__doc__
    )
    parser.add_argument(
        "--who", type=args.text, default="accord-reconcile", help="the principal recorded"
    )
    parser.add_argument(
        "--limit", type=args.count(), default=100, help="effects per pass (%(default)s)"
    )
    parser.add_argument(
        "--escalate-after-s",
        type=args.seconds(),
        default=None,
        help="escalate effects unresolved for longer (default: ACCORD_EFFECT_ESCALATE_AFTER_S)",
    )
    parser.add_argument(
        "--settle-s",
        type=args.seconds(),
        default=None,
        help='trust a "never accepted" only this long after the job\'s attempts could last'
        " have sent (its quiet_since; default: ACCORD_RECONCILE_SETTLE_S)",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    app = require_app(args, settings)
    return int(runtime.run(_main, args, settings, app))


async def _main(args: argparse.Namespace, settings: Settings, app: App) -> int:
    escalate_after_s = (
        settings.effect_escalate_after_s if args.escalate_after_s is None else args.escalate_after_s
    )
    settle_s = settings.reconcile_settle_s if args.settle_s is None else args.settle_s
    asked: dict[tuple[int, str, int], str] = {}
    conn = await repair_connection(settings)
    try:
        report = await reconcile.reconcile(
            conn,
            noting_keys(lookups(app), asked),
            who=args.who,
            escalate_after_s=escalate_after_s,
            settle_s=settle_s,
            limit=args.limit,
        )
        await trace_resolutions(conn, report, asked)
    finally:
        await conn.close()
    for done in report.resolved:
        print(
            f"resolved job={done.job_id} key={done.effect_key} seq={done.seq}"
            f" outcome={done.outcome} job_state={done.job_state} audit={done.audit_id}"
        )
    for job in report.resumed:
        print(f"resumed job={job.job_id} state={job.state} audit={job.audit_id}")
    for effect, why in report.left:
        print(f"left job={effect.job_id} key={effect.effect_key} seq={effect.seq} why={why}")
    for e in report.escalated:
        print(f"escalated job={e.job_id} key={e.effect_key} seq={e.seq} age_s={e.age_s:.0f}")
    print(
        f"reconcile: resolved={len(report.resolved)} resumed={len(report.resumed)}"
        f" left={len(report.left)} escalated={len(report.escalated)}"
    )
    # 1: a provider gave no answer this pass (try again later; a scheduler can tell).
    return 1 if any(why is reconcile.Left.LOOKUP_UNAVAILABLE for _, why in report.left) else 0
