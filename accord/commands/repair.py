"""`accord repair ...`: the checked repair operations, run as the repair role only.

Every subcommand connects to ``repair_pg_dsn`` (default ``pg_dsn``) with ``role`` set to
``repair_role`` (``accord_repair``) at connection start, so even an owner DSN runs with the
repair principal's narrow rights: it can resolve an effect with evidence, release a hold,
requeue poison, resume an ``unknown`` job whose effects are all resolved, and advance an
epoch past the ledger, each audited, and nothing else.

    accord repair resolve-effect --job J --key K --outcome succeeded|failed_before_dispatch \\
        --evidence REF --who NAME [--receipt R]
    accord repair release-hold --job J --evidence REF --who NAME
    accord repair requeue-poison --job J --evidence REF --who NAME
    accord repair resume --job J --evidence REF --who NAME   (unknown, every effect resolved)
    accord repair advance-epoch --tenant T --evidence REF --who NAME
    accord repair acknowledge-evidence --id N --evidence REF --who NAME   (a journal's note)
    accord repair restore-check          (exit 1 while a detected restore is open)
    accord repair audit (--job J | --tenant T)
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from accord import runtime
from accord.commands import args
from accord.jobs import authority, repair
from accord.jobs.ledger import FileLedger, Ledger, PgLedger
from accord.jobs.models import EffectState
from accord.schemas import migrate
from accord.schemas.db import Tx, connect, create_pool
from accord.schemas.settings import Settings


def ledger_from_settings(settings: Settings) -> Ledger:
    """The authority ledger the settings name: a separate database, else the ledger file."""
    if settings.ledger_pg_dsn:
        return PgLedger(settings.ledger_pg_dsn)
    return FileLedger(settings.ledger_path)


def repair_connect_args(settings: Settings) -> tuple[str, dict[str, Any]]:
    """The DSN and connect keywords of the repair principal."""
    dsn = settings.repair_pg_dsn or settings.pg_dsn
    role = settings.repair_role  # empty: the DSN's own user, as for the other roles
    return dsn, {"server_settings": {"role": role}} if role else {}


async def repair_connection(settings: Settings) -> asyncpg.Connection:
    """One connection as the repair role, on a schema no older than the code."""
    dsn, kwargs = repair_connect_args(settings)
    conn = await connect(dsn, **kwargs)  # DatabaseLoginRefused names the role it could not set
    await migrate.require_current(conn)
    return conn


def _principal(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--who", type=args.text, required=True, help="the person or tool doing the repair"
    )
    parser.add_argument(
        "--evidence", type=args.text, required=True, help="a reference to the evidence"
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "repair",
        help="repair operations (repair role only)",
        description="Audited repairs, as the repair principal (ACCORD_REPAIR_ROLE): each"
        " writes a jobs.repair_audit row naming --who and --evidence.",
    )
    ops = parser.add_subparsers(dest="repair_op", required=True, metavar="OPERATION")
    resolve = ops.add_parser(
        "resolve-effect",
        help="resolve an unknown effect with evidence",
        description="Record an unknown effect's outcome from evidence (a provider receipt,"
        " or proof that nothing was sent); never by time.",
    )
    resolve.add_argument(
        "--job", type=args.job_id, required=True, help="the job id (accord jobs list)"
    )
    resolve.add_argument("--key", type=args.text, required=True, help="the effect key")
    resolve.add_argument(
        "--outcome",
        required=True,
        choices=[EffectState.SUCCEEDED.value, EffectState.FAILED_BEFORE_DISPATCH.value],
        help="succeeded (the provider accepted it) or failed_before_dispatch (never sent)",
    )
    resolve.add_argument(
        "--receipt", type=args.text, default=None, help="the provider's receipt, if any"
    )
    _principal(resolve)
    for name, text in (
        ("release-hold", "release a held job (after its tenant's epoch was advanced)"),
        ("requeue-poison", "requeue a poison job with a fresh attempt budget"),
        (
            "resume",
            "requeue an unknown job whose effects are all resolved; its next run reuses each"
            " succeeded effect's recorded receipt instead of calling again",
        ),
    ):
        op = ops.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        op.add_argument(
            "--job", type=args.job_id, required=True, help="the job id (accord jobs list)"
        )
        _principal(op)
    advance = ops.add_parser(
        "advance-epoch",
        help="advance a tenant's epoch past the ledger",
        description="After a detected restore: advance the tenant's authority epoch past the"
        " ledger's, so new work may run; old-epoch work stays held.",
    )
    advance.add_argument(
        "--tenant", type=args.text, required=True, help="the tenant whose epoch advances"
    )
    _principal(advance)
    acknowledge = ops.add_parser(
        "acknowledge-evidence",
        help="let a worker's journal drop a begin a restore left without a record",
        description="Acknowledge a journal evidence note (accord status: journal evidence; a"
        " worker's start logs its id): a begin the worker's journal holds that the database has"
        " no record of. Ask the provider by its idempotency key first; the journal keeps the"
        " begin until this.",
    )
    acknowledge.add_argument(
        "--id", type=args.job_id, required=True, help="the note's id (evidence=N in the log)"
    )
    _principal(acknowledge)
    ops.add_parser(
        "restore-check",
        help="compare the database with the ledger now",
        description="Compare the database's epochs with the authority ledger; exit 1 while a"
        " restore is detected.",
    )
    audit = ops.add_parser(
        "audit",
        help="show the repair audit of a job or a tenant",
        description="The repair audit rows of a job or a tenant, oldest first.",
    )
    target = audit.add_mutually_exclusive_group(required=True)
    target.add_argument("--job", type=args.job_id, help="the job id")
    target.add_argument("--tenant", type=args.text, help="the tenant")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, settings: Settings) -> int:
    op: Callable[[argparse.Namespace, Settings], Awaitable[int]] = _OPS[args.repair_op]
    return int(runtime.run(op, args, settings))


async def _in_transaction(settings: Settings, work: Callable[[Any], Awaitable[Any]]) -> Any:
    conn = await repair_connection(settings)
    try:
        async with conn.transaction():
            return await work(conn)
    finally:
        await conn.close()


async def _resolve(args: argparse.Namespace, settings: Settings) -> int:
    async def work(tx: Tx) -> repair.EffectResolved:
        return await repair.resolve_effect(
            tx,
            args.job,
            args.key,
            EffectState(args.outcome),
            who=args.who,
            evidence=args.evidence,
            receipt=args.receipt,
        )

    done: repair.EffectResolved = await _in_transaction(settings, work)
    print(
        f"resolved job={done.job_id} key={done.effect_key} seq={done.seq}"
        f" outcome={done.outcome} job_state={done.job_state} audit={done.audit_id}"
    )
    return 0


JobRepair = Callable[..., Awaitable[repair.Repaired]]


def _job_repair(action: JobRepair, verb: str) -> Callable[..., Awaitable[int]]:
    """A `accord repair <job action>` command: one audited repair of one job, in its own
    transaction as the repair principal."""

    async def command(args: argparse.Namespace, settings: Settings) -> int:
        async def work(tx: Tx) -> repair.Repaired:
            return await action(tx, args.job, who=args.who, evidence=args.evidence)

        done: repair.Repaired = await _in_transaction(settings, work)
        print(f"{verb} job={done.job_id} state={done.state} audit={done.audit_id}")
        return 0

    return command


async def _advance(args: argparse.Namespace, settings: Settings) -> int:
    ledger = ledger_from_settings(settings)

    async def work(tx: Tx) -> repair.EpochAdvanced:
        return await repair.advance_epoch(
            tx, ledger, args.tenant, who=args.who, evidence=args.evidence
        )

    done: repair.EpochAdvanced = await _in_transaction(settings, work)
    print(
        f"advanced tenant={done.tenant} epoch={done.epoch}"
        f" (ledger was {done.ledger_epoch}) audit={done.audit_id}"
    )
    return 0


async def _acknowledge(args: argparse.Namespace, settings: Settings) -> int:
    async def work(tx: Tx) -> repair.EvidenceAcknowledged:
        return await repair.acknowledge_evidence(tx, args.id, who=args.who, evidence=args.evidence)

    done: repair.EvidenceAcknowledged = await _in_transaction(settings, work)
    print(f"acknowledged evidence={done.evidence_id} job={done.job_id} audit={done.audit_id}")
    return 0


async def _restore_check(args: argparse.Namespace, settings: Settings) -> int:
    await (await repair_connection(settings)).close()  # role and schema checks first
    dsn, kwargs = repair_connect_args(settings)
    pool = await create_pool(dsn, min_size=1, max_size=1, **kwargs)
    try:
        restores = await authority.require_authority(pool, ledger_from_settings(settings))
    finally:
        await pool.close()
    for r in restores:
        print(
            f"restore tenant={r.tenant} db_epoch={r.db_epoch} ledger_epoch={r.ledger_epoch}"
            f" held={r.held_jobs} (frozen until `accord repair advance-epoch`)"
        )
    print(f"restore-check: {len(restores)} open restore detections")
    return 1 if restores else 0


async def _audit(args: argparse.Namespace, settings: Settings) -> int:
    conn = await repair_connection(settings)
    try:
        rows = await repair.audit(conn, job_id=args.job, tenant=args.tenant)
    finally:
        await conn.close()
    for a in rows:
        print(
            f"{a.at.isoformat()} #{a.audit_id} {a.action} tenant={a.tenant} job={a.job_id}"
            f" key={a.effect_key} outcome={a.outcome} who={a.who} db_user={a.db_user}"
            f" db_role={a.db_role} evidence={a.evidence}"
        )
    return 0


_OPS: dict[str, Callable[[argparse.Namespace, Settings], Awaitable[int]]] = {
    "resolve-effect": _resolve,
    "release-hold": _job_repair(repair.release_hold, "released"),
    "requeue-poison": _job_repair(repair.requeue_poison, "requeued"),
    "resume": _job_repair(repair.resume, "resumed"),
    "advance-epoch": _advance,
    "acknowledge-evidence": _acknowledge,
    "restore-check": _restore_check,
    "audit": _audit,
}
