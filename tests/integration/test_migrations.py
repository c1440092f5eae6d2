"""The migrator on a real database: apply, no-op, tamper, check, ahead."""

from __future__ import annotations

from pathlib import Path

import anyio
import asyncpg
import pytest

from accord.demo import app as demo_app
from accord.jobs import EffectState, JobConflict, JobState, Store, repair, submit
from accord.jobs.errors import RepairRefused
from accord.jobs.models import Lease
from accord.schemas import migrate
from accord.schemas.errors import MigrationError, MigrationTampered, SchemaAhead, SchemaBehind
from tests.support import wait_for


async def test_empty_database_migrates_then_second_run_is_noop(empty_pg_dsn: str) -> None:
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        assert (await migrate.check(conn)).pending  # control: a new database is behind
        applied = await migrate.migrate(conn)
        assert applied == [("accord", m.version) for m in migrate.load_migrations()]
        assert await migrate.migrate(conn) == []
        assert (await migrate.check(conn)).current
        await migrate.require_current(conn)
        for schema in ("relay", "consumers", "jobs"):
            assert (
                await conn.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema)
                == 1
            )
    finally:
        await conn.close()


async def test_tampered_applied_file_is_refused(pg: asyncpg.Connection) -> None:
    await migrate.require_current(pg)  # control: the untouched ledger passes
    await pg.execute("UPDATE schemas.migrations SET checksum = 'feed' WHERE version = 1")
    with pytest.raises(MigrationTampered) as info:
        await migrate.migrate(pg)
    assert info.value.fields["version"] == 1
    assert "changed after it was applied" in str(info.value)


async def test_check_detects_a_database_behind_the_code(pg: asyncpg.Connection) -> None:
    assert (await migrate.check(pg)).current  # control
    latest = migrate.load_migrations()[-1]
    await pg.execute("DELETE FROM schemas.migrations WHERE version = $1", latest.version)
    status = await migrate.check(pg)
    assert status.pending == (latest.version,)
    with pytest.raises(SchemaBehind):
        await migrate.require_current(pg)


async def test_database_ahead_of_code_is_refused(pg: asyncpg.Connection) -> None:
    await pg.execute(
        "INSERT INTO schemas.migrations (version, name, checksum) VALUES (9999, 'future', 'x')"
    )
    with pytest.raises(SchemaAhead):
        await migrate.check(pg)


async def test_concurrent_migrators_apply_each_file_once(empty_pg_dsn: str) -> None:

    conns = [await asyncpg.connect(empty_pg_dsn) for _ in range(3)]
    results: list[list[tuple[str, int]]] = []
    try:

        async def run(conn: asyncpg.Connection) -> None:
            results.append(await migrate.migrate(conn))

        async with anyio.create_task_group() as tg:
            for conn in conns:
                tg.start_soon(run, conn)
        every = sorted(v for _, v in (x for r in results for x in r))
        assert every == [m.version for m in migrate.load_migrations()]
    finally:
        for conn in conns:
            await conn.close()


async def test_a_pending_file_below_an_applied_one_is_refused(pg: asyncpg.Connection) -> None:
    versions = [m.version for m in migrate.load_migrations()]
    # control: only the newest missing is an ordinary "behind" (it would apply last anyway)
    await pg.execute("DELETE FROM schemas.migrations WHERE version = $1", versions[-1])
    assert (await migrate.check(pg)).pending == (versions[-1],)
    # forbidden: a gap below the newest applied version would apply out of order
    await pg.execute(
        "INSERT INTO schemas.migrations (version, name, checksum) SELECT $1, $2, $3",
        versions[-1], migrate.load_migrations()[-1].name, migrate.load_migrations()[-1].checksum,
    )  # fmt: skip
    await pg.execute("DELETE FROM schemas.migrations WHERE version = $1", versions[1])
    with pytest.raises(MigrationError) as info:
        await migrate.check(pg)
    assert info.value.fields["pending"] == [versions[1]]


# A registration as a database at 0010 takes it (jobs.registration_audit comes with 0013).
REGISTER_AT_0010 = (
    "INSERT INTO jobs.workflows (workflow, owner, effects_enabled) VALUES ('w', 'o', false)"
)


async def claim_at_0010(conn: asyncpg.Connection) -> Lease:
    """One lease of workflow w for owner o, claimed as a worker of a database at 0010 claims
    (jobs.claim returns the attempt context only since 0036)."""
    [row] = await conn.fetch(
        "SELECT job_id, tenant, workflow, operation_id, owner, attempt_id, generation, epoch,"
        " lease_expires_at, payload FROM jobs.claim('w', 'o', 60, 1)"
    )
    return Lease.from_record(row)


async def test_0011_carries_every_operation_key_of_a_database_at_0010(empty_pg_dsn: str) -> None:
    """jobs.operations (0011) takes over the idempotency key from jobs.jobs: an upgraded
    database keeps every job's key, and work in flight across the upgrade still publishes."""
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        await migrate.migrate(conn, through=10)
        store = Store(conn)
        await conn.execute(REGISTER_AT_0010)
        ids: dict[tuple[str, str], int] = {}
        async with conn.transaction():
            for tenant, op in [("acme", "a"), ("acme", "b"), ("zeta", "a")]:
                done = await submit(conn, tenant=tenant, workflow="w", operation_id=op, digest="d")
                ids[(tenant, op)] = done.job_id
        lease = await claim_at_0010(conn)

        later = [("accord", m.version) for m in migrate.load_migrations() if m.version > 10]
        assert await migrate.migrate(conn) == later
        keys = await conn.fetch(
            "SELECT tenant, workflow, operation_id, job_id FROM jobs.operations"
        )
        assert {(r["tenant"], r["operation_id"]): r["job_id"] for r in keys} == ids
        assert {r["workflow"] for r in keys} == {"w"}
        assert await conn.fetchval(
            "SELECT convalidated FROM pg_constraint WHERE conname = 'jobs_operation_fkey'"
        )

        # The key still decides: the same operation is the same job, untouched; another
        # digest is a conflict; a new operation is a new job.
        async with conn.transaction():
            again = await submit(conn, tenant="acme", workflow="w", operation_id="a", digest="d")
            fresh = await submit(conn, tenant="acme", workflow="w", operation_id="c", digest="d")
        assert (again.job_id, again.created) == (ids[("acme", "a")], False)
        assert fresh.created and fresh.job_id > max(ids.values())
        with pytest.raises(JobConflict):
            async with conn.transaction():
                await submit(conn, tenant="acme", workflow="w", operation_id="b", digest="other")
        # The lease taken before the upgrade publishes after it.
        await store.publish(lease)
        assert (await store.job(lease.job_id)).state == "succeeded"
    finally:
        await conn.close()


async def test_0011_lets_a_publish_in_flight_finish_first(empty_pg_dsn: str) -> None:
    """0011 takes jobs.jobs whole. A publish whose first fence already holds its job row (and
    a weak lock on jobs.jobs) when the migration starts must still commit: the migration asks
    for its strongest lock first and waits, instead of upgrading a weaker one into a deadlock
    that PostgreSQL would break by failing the publish."""
    admin = await asyncpg.connect(empty_pg_dsn)
    worker = await asyncpg.connect(empty_pg_dsn)
    migrator = await asyncpg.connect(empty_pg_dsn)
    try:
        await migrate.migrate(admin, through=10)
        store = Store(admin)
        await admin.execute(REGISTER_AT_0010)
        async with admin.transaction():
            await submit(admin, tenant="acme", workflow="w", operation_id="a", digest="d")
        lease = await claim_at_0010(admin)
        applied: list[int] = []
        waiting = (
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'jobs.jobs'::regclass"
        )

        async with anyio.create_task_group() as tg:

            async def migrate_now() -> None:
                applied.extend(await migrate.migrate(migrator))

            async def callback(tx: asyncpg.Connection) -> None:
                # The first fence holds the row; now the migration starts and must wait.
                tg.start_soon(migrate_now)

                async def migration_waits() -> bool:
                    return bool(await admin.fetchval(waiting))

                await wait_for(migration_waits, within=10)

            await Store(worker).publish(lease, callback)

        assert applied == [
            ("accord", m.version) for m in migrate.load_migrations() if m.version > 10
        ]
        assert (await store.job(lease.job_id)).state == "succeeded"
    finally:
        for conn in (admin, worker, migrator):
            await conn.close()


V0_1 = Path(__file__).parent / "fixtures" / "v0_1"
# The ledger as 0.1 created it: one chain, keyed by version.
V0_1_LEDGER = """
CREATE SCHEMA schemas;
CREATE TABLE schemas.migrations (
    version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


async def test_a_database_migrated_by_0_1_upgrades_in_place(empty_pg_dsn: str) -> None:
    """0.2 moved 0007 (the demo's tables) into the demo application's chain and rewrote 0006
    and 0008: a database migrated by 0.1 is reported behind (not tampered, not ahead), then
    re-recorded and migrated, keeping its rows; the demo's own chain applies on top of the
    tables 0.1 created."""
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        await conn.execute(V0_1_LEDGER)
        old = {p.name: p.read_text(encoding="utf-8") for p in V0_1.glob("*.sql")}
        for m in migrate.load_migrations():
            if m.version > 12:
                break
            name = f"{m.version:04d}_{m.name}.sql"
            text = old.get(name, m.text)
            if m.version == 8:  # 0007 came before it in 0.1
                await _apply_v0_1(conn, 7, "demo", old["0007_demo.sql"])
            await _apply_v0_1(conn, m.version, m.name, text)
        assert set(migrate.RETIRED) == {6, 7, 8}
        await conn.execute(
            "INSERT INTO demo.submissions (tenant, report_id, subject, operation_id, event_id)"
            " VALUES ('acme', 'r1', 's', 'report:r1', gen_random_uuid())"
        )
        with pytest.raises(SchemaBehind):  # reported behind, never tampered or ahead
            await migrate.require_current(conn, demo_app.migration_chains())
        applied = await migrate.migrate(conn, app_chains=demo_app.migration_chains())
        # accord's files after 0.1's last (0012), then the demo's whole chain
        later = [("accord", m.version) for m in migrate.load_migrations() if m.version > 12]
        demo = [("demo", m.version) for c in demo_app.migration_chains() for m in c.migrations]
        assert applied == later + demo and ("accord", 13) in later and ("demo", 1) in demo
        await migrate.require_current(conn, demo_app.migration_chains())
        rows = await conn.fetch("SELECT component, version FROM schemas.migrations")
        assert ("accord", 7) not in {tuple(r) for r in rows}
        assert await conn.fetchval("SELECT count(*) FROM demo.submissions") == 1
        assert await migrate.migrate(conn, app_chains=demo_app.migration_chains()) == []
    finally:
        await conn.close()


async def _apply_v0_1(conn: asyncpg.Connection, version: int, name: str, text: str) -> None:
    async with conn.transaction():
        await conn.execute(text)
        await conn.execute(
            "INSERT INTO schemas.migrations (version, name, checksum) VALUES ($1, $2, $3)",
            version,
            name,
            migrate.Migration(version, name, text).checksum,
        )


async def test_0037_flags_the_live_jobs_of_a_tenant_frozen_before_it(empty_pg_dsn: str) -> None:
    """A database at 0036 with tenant ice frozen and tenant acme thawed, each with a queued
    job: 0037 flags ice's job (the claim's index leaves it out) and not acme's, acme's is
    claimed, and a thaw after the upgrade makes ice's job claimable."""
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        await migrate.migrate(conn, through=36)
        store = Store(conn, backoff_base_s=0.0)
        await store.register_workflow("w", "o")
        for tenant in ("ice", "acme"):
            async with conn.transaction():
                await submit(conn, tenant=tenant, workflow="w", operation_id="a", digest="d")
        await store.freeze("ice")
        assert await migrate.migrate(conn) == [
            ("accord", m.version) for m in migrate.load_migrations() if m.version > 36
        ]
        flags = await conn.fetch("SELECT tenant, tenant_frozen FROM jobs.jobs")
        assert dict((r["tenant"], r["tenant_frozen"]) for r in flags) == {
            "ice": True,
            "acme": False,
        }
        assert [lease.tenant for lease in await store.claim("w", "o", lease_s=60, limit=5)] == [
            "acme"
        ]
        await store.unfreeze("ice")
        assert [lease.tenant for lease in await store.claim("w", "o", lease_s=60, limit=5)] == [
            "ice"
        ]
    finally:
        await conn.close()


async def test_0038_parks_the_jobs_refused_while_their_class_stays_disabled(
    empty_pg_dsn: str,
) -> None:
    """A database at 0037 with two jobs refused for effects_disabled (due again after their
    backoff, as jobs.fail left them): one of class w, still disabled, one of class e, enabled
    since. 0038 parks w's job out of the claim's range and leaves e's, which is claimed; an
    enabling of w after the upgrade brings its job back."""
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        await migrate.migrate(conn, through=37)
        store = Store(conn, backoff_base_s=0.0)
        for workflow in ("w", "e"):
            await store.register_workflow(workflow, "o")
            async with conn.transaction():
                await submit(conn, tenant="acme", workflow=workflow, operation_id="a", digest="d")
            [lease] = await store.claim(workflow, "o", lease_s=60, limit=5)
            await store.fail(lease, "effects_disabled", retry=True)
        await store.register_workflow("e", "o", effects_enabled=True)
        assert await migrate.migrate(conn) == [
            ("accord", m.version) for m in migrate.load_migrations() if m.version > 37
        ]
        parked = await conn.fetch("SELECT workflow, run_after = 'infinity' AS p FROM jobs.jobs")
        assert {r["workflow"]: r["p"] for r in parked} == {"w": True, "e": False}
        assert len(await store.claim("e", "o", lease_s=60, limit=5)) == 1
        assert await store.claim("w", "o", lease_s=60, limit=5) == []
        await store.register_workflow("w", "o", effects_enabled=True)
        assert len(await store.claim("w", "o", lease_s=60, limit=5)) == 1
    finally:
        await conn.close()


async def test_0041_carries_the_refusals_recorded_before_it_into_the_totals(
    empty_pg_dsn: str,
) -> None:
    """A database at 0040 whose ledger holds 2 refusals of one run: 0041's totals start at 2,
    and a refusal recorded after the upgrade counts on from there."""
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        await migrate.migrate(conn, through=40)
        run_id = await conn.fetchval(
            "INSERT INTO ops.replay_runs (workflow, since) VALUES ('p', now()) RETURNING run_id"
        )
        refusal = (
            "INSERT INTO ops.replay_refusals (run_id, workflow, tenant, operation_id, event_id,"
            " event_type, outbox_id, reason, sqlstate, message) VALUES ($1, 'p', 'acme', $2,"
            " gen_random_uuid(), 't', 1, 'insufficient_privilege', '42501', 'm')"
        )
        for op in ("a", "b"):
            await conn.execute(refusal, run_id, op)
        await migrate.migrate(conn)
        totals = "SELECT refusals FROM ops.replay_refusal_totals WHERE workflow = 'p'"
        assert await conn.fetchval(totals) == 2
        await conn.execute(refusal, run_id, "c")
        assert await conn.fetchval(totals) == 3
    finally:
        await conn.close()


async def test_0051_brings_a_window_past_a_century_back_with_its_promises(
    empty_pg_dsn: str,
) -> None:
    """A database at 0050 where a process declared a 1e12 s window, then a day (a lowering,
    which promised the 1e12 s horizon until the year 33715): every reserve and inbox prune of
    that consumer failed (22008). 0051 brings the window and the promise within bounds; the
    consumer's inbox prune and a new declaration work again. Control: a sane window stays."""
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        await migrate.migrate(conn, through=50)
        declare = "SELECT consumers.declare_window($1, $2, 300)"
        await conn.execute(declare, "sane", 7 * 86400.0)
        await conn.execute(declare, "huge", 1e12)
        await conn.execute(declare, "huge", 86400.0)
        # What the inbox prune and jobs.prune compute from the horizon:
        horizon = (
            "SELECT now() - make_interval(secs => h.horizon_s) FROM consumers.replay_horizons h"
            " WHERE h.consumer = $1"
        )
        with pytest.raises(asyncpg.DatetimeFieldOverflowError):
            await conn.fetchval(horizon, "huge")
        await migrate.migrate(conn)
        assert await conn.fetchval(horizon, "huge") is not None
        windows = dict(
            await conn.fetch("SELECT consumer, replay_window_s FROM consumers.replay_windows")
        )
        assert windows == {"sane": 7 * 86400.0, "huge": 86400.0}
        assert (
            await conn.fetchval("SELECT max(horizon_s) FROM consumers.replay_promises")
            == 6307200000
        )
        await conn.execute(declare, "huge", 2 * 86400.0)  # declarations work again
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(declare, "huge", 1e12)
    finally:
        await conn.close()


@pytest.mark.parametrize(("alive", "mark"), [(True, 0), (False, 3)])
async def test_0054_freezes_the_prune_mark_below_the_oldest_job_still_present(
    empty_pg_dsn: str, alive: bool, mark: int
) -> None:
    """A database at 0053 whose retention removed jobs 2 and 3 (mark 3) while job 1 still
    waits (retention takes the oldest finished first, not the lowest ids). 0054 freezes the
    mark below job 1: a later attempt of job 1, lost by a restore, never reads as pruned.
    Control: a database whose jobs at or below the mark are all gone keeps its mark."""
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        await migrate.migrate(conn, through=53)
        await Store(conn, backoff_base_s=0.0).register_workflow("w", "o")
        for n in range(1, 5):
            async with conn.transaction():
                await submit(conn, tenant="acme", workflow="w", operation_id=f"op-{n}", digest="d")
        gone = [2, 3] if alive else [1, 2, 3]
        async with conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")  # as jobs.prune
            await conn.execute("DELETE FROM jobs.operations WHERE job_id = ANY($1)", gone)
            await conn.execute("DELETE FROM jobs.jobs WHERE job_id = ANY($1)", gone)
            await conn.execute("INSERT INTO jobs.pruned (through_job_id) VALUES (3)")
        await migrate.migrate(conn)
        assert await conn.fetchval("SELECT through_job_id FROM jobs.pruned") == mark
    finally:
        await conn.close()


async def _unknown_job(
    conn: asyncpg.Connection, store: Store, tenant: str, op: str, reason: str, *, retry: bool
) -> int:
    """A job of class ``w`` claimed, its effect ``k`` unknown, given up with ``reason``."""
    async with conn.transaction():
        done = await submit(conn, tenant=tenant, workflow="w", operation_id=op, digest="d")
    [lease] = await store.claim("w", "o", lease_s=30)
    await store.begin_effect(lease, "k", "i")
    await store.finish_effect(lease, "k", EffectState.UNKNOWN)
    assert await store.fail(lease, reason, retry=retry) is JobState.UNKNOWN
    return done.job_id


async def test_0055_keeps_the_verdict_of_jobs_the_runner_gave_up_for_good(
    empty_pg_dsn: str,
) -> None:
    """A database at 0054 holding two unknown jobs with an unknown effect each: one the runner
    gave up for a handler defect (retry=False, its typed reason), one for the unknown effect
    itself (retry=True). 0055 marks the first alone: resolved, it is failed, the other queued."""
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        await migrate.migrate(conn, through=54)
        store = Store(conn, backoff_base_s=0.0)
        await store.register_workflow("w", "o", effects_enabled=True)
        jobs: dict[str, int] = {}
        for reason, retry in (("effect_conflict", False), ("effect_unknown", True)):
            job_id = await _unknown_job(conn, store, "acme", reason, reason, retry=retry)
            jobs[reason] = job_id
        await migrate.migrate(conn)
        flags = dict(await conn.fetch("SELECT last_error, final_failure FROM jobs.jobs"))
        assert flags == {"effect_conflict": True, "effect_unknown": False}
        states = {}
        for reason, job_id in jobs.items():
            async with conn.transaction():
                resolved = await repair.resolve_effect(
                    conn, job_id, "k", EffectState.FAILED_BEFORE_DISPATCH, who="t", evidence="e"
                )
            states[reason] = resolved.job_state
        assert states == {"effect_conflict": JobState.FAILED, "effect_unknown": JobState.QUEUED}
    finally:
        await conn.close()


async def test_0059_fails_the_jobs_given_up_for_good_that_waited_for_a_resume(
    empty_pg_dsn: str,
) -> None:
    """A database at 0054 holding two unknown jobs whose effect a person resolved succeeded
    (the provider took it, the reply was lost): one the runner gave up for a handler defect
    (retry=False), one for the unknown effect (retry=True). Both waited for a resume. 0055
    marked the first, and no resolution came after it to fail it: `accord repair resume`
    queued it, running again what its handler had given up on. 0059 fails it; a resume of a
    job so marked is refused (final_failure). Control: the other job is resumed."""
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        await migrate.migrate(conn, through=54)
        store = Store(conn, backoff_base_s=0.0)
        await store.register_workflow("w", "o", effects_enabled=True)
        jobs: dict[str, int] = {}
        for reason, retry in (("effect_conflict", False), ("effect_unknown", True)):
            job_id = await _unknown_job(conn, store, "acme", reason, reason, retry=retry)
            async with conn.transaction():
                resolved = await repair.resolve_effect(
                    conn, job_id, "k", EffectState.SUCCEEDED, who="t", evidence="receipt"
                )
            assert resolved.job_state is JobState.UNKNOWN  # awaiting a person's resume
            jobs[reason] = job_id
        await migrate.migrate(conn, through=58)
        stuck = "SELECT state, final_failure FROM jobs.jobs WHERE job_id = $1"
        assert tuple(await conn.fetchrow(stuck, jobs["effect_conflict"])) == ("unknown", True)
        await migrate.migrate(conn)
        states = dict(await conn.fetch("SELECT last_error, state FROM jobs.jobs"))
        assert states == {"effect_conflict": "failed", "effect_unknown": "unknown"}
        # A resume of a job given up for good is refused, whatever brought it there.
        async with conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")
            await conn.execute(
                "UPDATE jobs.jobs SET final_failure = true WHERE job_id = $1",
                jobs["effect_unknown"],
            )
        with pytest.raises(RepairRefused) as refused:
            async with conn.transaction():
                await repair.resume(conn, jobs["effect_unknown"], who="t", evidence="e")
        assert refused.value.fields["reason"] == "final_failure"
        await conn.execute(
            "UPDATE jobs.jobs SET final_failure = false WHERE job_id = $1", jobs["effect_unknown"]
        )
        async with conn.transaction():  # control: the job given up with a retry resumes
            resumed = await repair.resume(conn, jobs["effect_unknown"], who="t", evidence="e")
        assert resumed.state is JobState.QUEUED
    finally:
        await conn.close()


async def test_0060_holds_the_old_unknown_jobs_of_restored_tenants(empty_pg_dsn: str) -> None:
    """A database at 0059: an unknown job in a tenant whose restore is open, one in a tenant
    whose restore was advanced already (claimed before the advance) beside one claimed
    after it, and one in a tenant with no restore. 0060 holds the first two, keeping why
    they were unknown, and counts the open restore's; the others stay unknown (controls)."""
    conn = await asyncpg.connect(empty_pg_dsn)
    try:
        await migrate.migrate(conn, through=59)
        store = Store(conn, backoff_base_s=0.0)
        await store.register_workflow("w", "o", effects_enabled=True)

        async def unknown(tenant: str, op: str) -> int:
            return await _unknown_job(conn, store, tenant, op, "lost reply", retry=True)

        jobs = {
            "open": await unknown("open", "a"),
            "advanced-old": await unknown("advanced", "b"),
            "plain": await unknown("plain", "c"),
        }
        advanced = await conn.fetchval(  # the epoch the advance moved to
            "UPDATE jobs.tenants SET epoch = epoch + 1 WHERE tenant = 'advanced' RETURNING epoch"
        )
        jobs["advanced-new"] = await unknown("advanced", "d")
        await conn.execute(
            "INSERT INTO jobs.authority_restores (tenant, db_epoch, ledger_epoch, detected_by,"
            " resolved_at, resolved_epoch) VALUES ('open', 0, 1, 't', NULL, NULL),"
            " ('advanced', 0, 0, 't', now(), $1)",
            advanced,
        )
        await migrate.migrate(conn)
        rows = await conn.fetch("SELECT job_id, state, last_error FROM jobs.jobs")
        by_id = {r["job_id"]: (r["state"], r["last_error"]) for r in rows}
        assert {name: by_id[job] for name, job in jobs.items()} == {
            "open": ("held", "lost reply"),
            "advanced-old": ("held", "lost reply"),
            "plain": ("unknown", "lost reply"),
            "advanced-new": ("unknown", "lost reply"),
        }
        counts = dict(await conn.fetch("SELECT tenant, held_jobs FROM jobs.authority_restores"))
        assert counts == {"open": 1, "advanced": 0}
    finally:
        await conn.close()
