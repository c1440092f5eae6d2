"""`accord reconcile`: resolve unknown effects with the provider's evidence, one pass.

Runs as the repair role (see `accord repair`). For each effect needing reconciliation it
asks the provider for the receipt of the effect's idempotency key (the same key the runner
sent: jobs.runner.effects.idempotency_key). A receipt resolves it to ``succeeded``; a
definite "never seen", for an effect older than ``reconcile_settle_s``, resolves it to
``failed_before_dispatch`` (the job may run again); anything else leaves it unknown. A
resolution that leaves the job with every effect outcome known (one succeeded) also resumes
it (`accord repair resume`, audited, the provider's answer as evidence): its next run reuses
the recorded receipt and publishes. With an
empty provider URL (``--provider-url ''`` or ``ACCORD_PROVIDER_URL=``) there is no lookup: a
person resolves with `accord repair resolve-effect`. Either way, effects unresolved for longer than
``effect_escalate_after_s`` are escalated, never resolved by time.
"""

from __future__ import annotations

import argparse
import uuid

from accord import runtime
from accord.commands.repair import repair_connection
from accord.provider import ProviderClient, ProviderLookupFailed
from jobs import reconcile
from jobs.errors import LookupUnavailable
from jobs.models import Lease
from jobs.runner.effects import idempotency_key
from schemas.settings import Settings


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


def provider_lookup(client: ProviderClient) -> reconcile.Lookup:
    """A reconcile lookup over the provider's receipt lookup by idempotency key."""

    async def lookup(effect: reconcile.UnresolvedEffect) -> reconcile.Answer:
        key = effect_idempotency_key(effect)
        try:
            receipt = await client.lookup(key)
        except ProviderLookupFailed as exc:
            raise LookupUnavailable(job_id=effect.job_id, key=key) from exc
        if receipt is None:
            return reconcile.Answer(None, f"provider lookup: key {key} never accepted")
        return reconcile.Answer(
            receipt.receipt_id,
            f"provider receipt {receipt.receipt_id} for key {key}"
            f" (body sha256 {receipt.body_sha256}, accepted at {receipt.accepted_at})",
        )

    return lookup


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("reconcile", help="resolve unknown effects with provider evidence")
    parser.add_argument("--provider-url", default=None, help="default: settings provider_url")
    parser.add_argument("--who", default="accord-reconcile", help="the principal recorded")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--escalate-after-s", type=float, default=None)
    parser.add_argument("--settle-s", type=float, default=None)
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    return int(runtime.run(_main, args, settings))


async def _main(args: argparse.Namespace, settings: Settings) -> int:
    url = args.provider_url if args.provider_url is not None else settings.provider_url
    lookup = provider_lookup(ProviderClient(url)) if url else None
    escalate_after_s = (
        settings.effect_escalate_after_s if args.escalate_after_s is None else args.escalate_after_s
    )
    settle_s = settings.reconcile_settle_s if args.settle_s is None else args.settle_s
    conn = await repair_connection(settings)
    try:
        report = await reconcile.reconcile(
            conn,
            lookup,
            who=args.who,
            escalate_after_s=escalate_after_s,
            settle_s=settle_s,
            limit=args.limit,
        )
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
    return 0
