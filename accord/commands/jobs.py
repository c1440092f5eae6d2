"""`accord jobs list|show`: find a job's id, then everything accord knows about it.

    accord jobs list [--state S] [--tenant T] [--workflow C] [--limit N] [--json]
    accord jobs show ID [--json]

`list` prints one line per job, newest first: id, tenant, class, operation id, state,
attempts, generation, last update and last error. `show` prints one job from one snapshot:
its fields, its attempt (owner and lease while it runs), each effect record with its outcome,
receipt and the evidence that resolved it, its repair audit and its class's registration
audit, why it waits, and the next step a person can take. For an effect whose outcome is
unknown it names the idempotency key the runner sent and, with ``--app``, the provider that
owns the key (the one `accord reconcile` asks); the evidence the repair needs is that
provider's answer for that key. Neither ever prints a payload. Read-only, on ACCORD_PG_DSN.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from accord import runtime
from accord.app import App
from accord.commands import args
from accord.commands.common import optional_app
from accord.commands.reconcile import effect_idempotency_key
from accord.jobs import reconcile, views
from accord.jobs.models import EffectState, JobState
from accord.schemas import migrate
from accord.schemas.db import connect
from accord.schemas.settings import Settings

RESOLVE = (
    "`accord repair resolve-effect --job {job} --key {key}"
    " --outcome succeeded|failed_before_dispatch --who NAME --evidence REF`"
)
#: The repair that moves a job on, by why it waits (effects are handled one by one).
NEXT_BY_REASON = {
    "held": "`accord repair release-hold --job {job} --who NAME --evidence REF`"
    " (after `accord repair advance-epoch` if its tenant's restore is open; resolve each"
    " effect of unknown outcome above first: released with one unresolved, it is unknown"
    " again and `accord reconcile` may run it with nobody looking; released with a"
    " succeeded one, it waits for `accord repair resume`; given up for good, it is failed)",
    "awaiting_resume": "every effect outcome is known: `accord repair resume --job {job}"
    " --who NAME --evidence REF` (the next run reuses the recorded receipts)",
    "unregistered_workflow": "register the class: `accord register --workflow {workflow}"
    " --owner O`",
    "tenant_frozen": "the tenant's authority is frozen: see `accord status` (tenants)",
    "effects_disabled": "the class may not begin effects: `accord register --workflow"
    " {workflow} --owner O --effects enabled`",
    "no_live_worker": "no worker serves the class: start `accord worker --workflow {workflow}`",
}
NEXT_POISON = "`accord repair requeue-poison --job {job} --who NAME --evidence REF`"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "jobs",
        help="list jobs, or show one job's attempts, effects, audits and why it waits",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ops = parser.add_subparsers(dest="jobs_op", required=True, metavar="OPERATION")
    listing = ops.add_parser(
        "list",
        help="jobs newest first, one line each (never the payload)",
        description="Jobs newest first, one line each: id, tenant, workflow class, operation"
        " id, state, attempts, generation, last update and last error (never the payload).",
    )
    listing.add_argument(
        "--state", choices=[s.value for s in JobState], help="only jobs in this state"
    )
    listing.add_argument("--tenant", type=args.text, help="only this tenant's jobs")
    listing.add_argument(
        "--workflow", type=args.text, metavar="CLASS", help="only jobs of this workflow class"
    )
    listing.add_argument(
        "--limit",
        type=args.count(),
        default=views.DEFAULT_LIMIT,
        help="at most this many (%(default)s)",
    )
    listing.add_argument("--json", action="store_true", help="print JSON for scripts")
    show = ops.add_parser(
        "show",
        help="one job: attempts, effects and their evidence, audit rows, why it waits",
        description="One job from one snapshot: fields, attempt and lease, effects with"
        " outcome, receipt and evidence, repair and registration audit, why it waits, and the"
        " next step. With --app, an unknown effect names the provider reconcile asks.",
    )
    show.add_argument(
        "job_id", type=args.job_id, metavar="ID", help="the job id (`accord jobs list`)"
    )
    show.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    app = optional_app(args, settings)
    return int(runtime.run(_main, args, settings, app))


async def _main(args: argparse.Namespace, settings: Settings, app: App | None) -> int:
    dsn = settings.pg_dsn
    conn = await connect(dsn)
    try:
        await migrate.require_current(conn, app.migration_chains() if app else ())
        if args.jobs_op == "list":
            lines = await views.list_jobs(
                conn, state=args.state, tenant=args.tenant, workflow=args.workflow,
                limit=args.limit,
            )  # fmt: skip
            print(_json([_plain_dict(j) for j in lines]) if args.json else render_list(lines))
            return 0
        job = await views.show_job(conn, args.job_id)
    finally:
        await conn.close()
    unknown = [effect_step(job, e, app, settings.reconcile_settle_s) for e in job.unresolved]
    steps = next_steps(job, unknown)
    if args.json:
        print(_json({**_plain_dict(job), "unresolved": _plain(unknown), "next_steps": steps}))
    else:
        print(render(job, unknown, steps))
    return 0


# -- what a person can do next --------------------------------------------------------------


def _unresolved(job: views.JobDetail, e: views.EffectDetail) -> reconcile.UnresolvedEffect:
    return reconcile.UnresolvedEffect(
        tenant=job.tenant, job_id=job.job_id, workflow=job.workflow,
        operation_id=job.operation_id, job_state=job.state, effect_key=e.effect_key,
        seq=e.seq, intent_digest=e.intent_digest, state=e.state, receipt=e.receipt,
        attempt_id=e.attempt_id, generation=e.generation, begun_at=e.begun_at,
        escalated_at=e.escalated_at, age_s=e.age_s,
    )  # fmt: skip


def effect_step(
    job: views.JobDetail, e: views.EffectDetail, app: App | None, settle_s: float = 0.0
) -> dict[str, Any]:
    """For an effect whose outcome is not known: its idempotency key, the provider that owns
    the key, and what evidence resolves it. While an attempt of the job may still be sending
    (``quiet_since`` plus ``settle_s``, ACCORD_RECONCILE_SETTLE_S, is ahead), it says that a
    provider's "never seen" is no evidence yet, and from when it is (``never_seen_from``)."""
    key = effect_idempotency_key(_unresolved(job, e))
    resolve = RESOLVE.format(job=job.job_id, key=e.effect_key)
    step: dict[str, Any] = {"effect_key": e.effect_key, "seq": e.seq, "idempotency_key": key}
    if e.state is EffectState.PENDING and job.state is JobState.RUNNING:
        step["provider"] = None
        step["evidence"] = (
            f"in flight: attempt {e.attempt_id} is still running and records the outcome;"
            " reconcile takes it over only if the job stops running"
        )
        return step
    owner = app.owner_of(e.effect_key) if app is not None else None
    step["provider"] = owner.name if owner is not None else None
    if app is None:
        why = (
            f"the provider that owns key {e.effect_key!r} knows: ask it for idempotency key"
            f" {key} (pass --app to name it); or {resolve}"
        )
    elif job.workflow not in app.jobs:
        why = (
            f"{app.name} does not declare class {job.workflow!r}, so its reconcile never asks"
            f" about it: ask the provider that owns key {e.effect_key!r} for idempotency key"
            f" {key}; or {resolve}"
        )
    elif owner is None:
        why = (
            f"no provider of {app.name} owns key {e.effect_key!r}, so reconcile never asks:"
            f" find who received idempotency key {key}; or {resolve}"
        )
    elif owner.lookup is None:
        why = (
            f"provider {owner.name} owns the key but offers no lookup: ask it for idempotency"
            f" key {key}; or {resolve}"
        )
    else:
        why = f"reconcile asks provider {owner.name} for idempotency key {key}; or {resolve}"
    if e.quiet_since is not None and e.quiet_s is not None and e.quiet_s < settle_s:
        trusted = e.quiet_since + timedelta(seconds=settle_s)
        step["never_seen_from"] = trusted
        why = (
            f"nothing of the job is sent after {_text(e.quiet_since)} (the end of the leases"
            f" it granted), but a request in flight may still land: a provider's \"never"
            f' seen" is evidence only from {_text(trusted)}; {why}'
        )
    step["evidence"] = why
    return step


def next_steps(job: views.JobDetail, unknown: list[dict[str, Any]]) -> list[str]:
    """The next step a person can take, in order: each unknown effect, then the job's."""
    steps = [str(u["evidence"]) for u in unknown]
    names = {"job": job.job_id, "workflow": job.workflow}
    if job.waiting_reason in NEXT_BY_REASON:
        steps.append(NEXT_BY_REASON[job.waiting_reason].format(**names))
    elif job.state is JobState.POISON and not job.unresolved:
        steps.append(NEXT_POISON.format(**names))
    return steps


# -- rendering ------------------------------------------------------------------------------

#: asyncpg reads PostgreSQL's infinite timestamps as naive ``datetime.max`` / ``min``: JSON says
#: what they are, as PostgreSQL spells them, not a zoneless date in the year 9999.
_INFINITIES = {datetime.max: "infinity", datetime.min: "-infinity"}


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime) and value in _INFINITIES:
        return _INFINITIES[value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain_dict(value)
    if value is not None and not isinstance(value, str | int | bool):
        return str(value)  # UUIDs
    return value


def _plain_dict(row: Any) -> dict[str, Any]:
    return {f.name: _plain(getattr(row, f.name)) for f in dataclasses.fields(row)}


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True)


def _text(value: Any, width: int = 80) -> str:
    value = _plain(value)
    if value is None:
        return "-"
    text = str(value).replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def _run_after(value: datetime) -> str:
    """``infinity`` (asyncpg's datetime.max): parked for disabled effects (0038)."""
    if value == datetime.max:
        return "never, parked until its class's effects are enabled"
    return _text(value)


def render_list(lines: list[views.JobLine]) -> str:
    if not lines:
        return "jobs: none"
    headers = ["id", "tenant", "workflow", "operation", "state", "attempts", "gen", "updated",
               "last_error"]  # fmt: skip
    rows = [
        [str(j.job_id), j.tenant, j.workflow, _text(j.operation_id, 40), j.state.value,
         f"{j.attempts}/{j.max_attempts}", str(j.generation), _text(j.updated_at),
         _text(j.last_error, 60)]
        for j in lines
    ]  # fmt: skip
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    )


def render(job: views.JobDetail, unknown: list[dict[str, Any]], steps: list[str]) -> str:
    """The human view of one job (identifiers, states, reasons, evidence; no payload)."""
    j = job
    out = [
        f"job {j.job_id}  tenant={j.tenant}  workflow={j.workflow}  operation={j.operation_id}",
        f"state: {j.state.value}  waits: {_text(j.waiting_reason)}"
        f"  claimable: {'yes' if j.claimable else 'no'}",
        f"attempts: {j.attempts} of {j.max_attempts}  generation: {j.generation}"
        f"  last error: {_text(j.last_error, 200)}",
    ]
    if j.state is JobState.UNKNOWN and j.final_failure:
        out.append(
            "given up without a retry: once its effects are resolved it is failed, never run again"
        )
    if j.state is JobState.RUNNING:
        out.append(
            f"lease: owner={j.owner} attempt={j.attempt_id} epoch={j.epoch}"
            f" expires={_text(j.lease_expires_at)}"
        )
    out.append(
        f"created: {_text(j.created_at)}  updated: {_text(j.updated_at)}"
        f"  run after: {_run_after(j.run_after)}"
        f"  resumed at generation: {_text(j.resumed_generation)}"
    )
    effects = "-" if j.effects_enabled is None else ("enabled" if j.effects_enabled else "off")
    out.append(f"class: owner={_text(j.class_owner)} effects={effects}")
    out.append(f"effects ({len(j.effects)}, {j.unresolved_effects} with unknown outcome):")
    keys = {(u["effect_key"], u["seq"]): u for u in unknown}
    for e in j.effects:
        out.append(
            f"  {e.effect_key} #{e.seq} {e.state.value}  generation={e.generation}"
            f"  begun={_text(e.begun_at)} finished={_text(e.finished_at)}"
            f"  receipt={_text(e.receipt)}"
            + (f"  escalated={_text(e.escalated_at)}" if e.escalated_at else "")
        )
        if (e.effect_key, e.seq) in keys:
            u = keys[(e.effect_key, e.seq)]
            out.append(
                f"    outcome unknown: idempotency key {u['idempotency_key']}"
                f"  provider: {_text(u['provider'])}"
            )
        if e.resolved_audit is not None:
            out.append(
                f"    resolved by {e.resolved_by} (audit #{e.resolved_audit}),"
                f" evidence: {_text(e.resolved_evidence, 200)}"
            )
    out.append(f"repair audit ({len(j.repair_audit)}):")
    for a in j.repair_audit:
        out.append(
            f"  {a.at.isoformat()} #{a.audit_id} {a.action} key={_text(a.effect_key)}"
            f" outcome={a.outcome} who={a.who} db_user={a.db_user} db_role={a.db_role}"
            f" evidence={_text(a.evidence, 200)}"
        )
    out.append(f"registration audit of class {j.workflow} ({len(j.registration_audit)}):")
    for r in j.registration_audit:
        out.append(
            f"  {_text(r['at'])} #{r['audit_id']} {r['action']} owner={r['owner']}"
            f" effects={'enabled' if r['effects_enabled'] else 'off'}"
            f" previous_owner={_text(r['previous_owner'])} who={r['who']} db_user={r['db_user']}"
        )
    out.append("next:" if steps else "next: nothing to do")
    out.extend(f"  {s}" for s in steps)
    return "\n".join(out)
