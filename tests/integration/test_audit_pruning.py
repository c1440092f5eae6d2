"""The audit pruners read only what they may remove (migrations 0031 and 0042): a batch costs
the expired rows, not the history kept. jobs.prune's repair audit, registration audit and
restore record steps and relay.prune_release_audit each take their batch in age order on an
index of it."""

from __future__ import annotations

import re
from dataclasses import dataclass

import asyncpg
import pytest

from tests.support import filtered_out, logged_plans

KEPT, EXPIRED = 20000, 3


@dataclass(frozen=True)
class Audit:
    table: str
    index: str
    insert: str  # $1 rows, $2 seconds old, each one the pruner may take once it expires
    prune: str  # one batch with a retention of a day; returns the audit rows removed
    setup: str | None = None  # run once before the rows are inserted
    newest: str | None = None  # a row the pruner keeps, inserted last


REPAIR = Audit(
    "jobs.repair_audit",
    "repair_audit_at_idx",
    "INSERT INTO jobs.repair_audit (at, action, who, db_user, db_role, tenant, job_id, outcome,"
    " evidence) SELECT now() - make_interval(secs => $2), 'resume', 'ops', 'u', 'r', 'acme',"
    " NULL, 'ok', 'ticket' FROM generate_series(1, $1)",
    "SELECT audit_pruned FROM jobs.prune(86400, 86400, 100)",
)
REGISTRATION = Audit(
    "jobs.registration_audit",
    "registration_audit_at_idx",
    # one class's rows: each may go once old enough, but for its newest (inserted last; an
    # old newest row is kept too, tests/integration/jobs/test_retention.py)
    "INSERT INTO jobs.registration_audit (at, action, workflow, owner, effects_enabled, who)"
    " SELECT now() - make_interval(secs => $2), 'register', 'report', 'w', true, 'ops'"
    " FROM generate_series(1, $1)",
    "SELECT audit_pruned FROM jobs.prune(86400, 86400, 100)",
    newest="INSERT INTO jobs.registration_audit (action, workflow, owner, effects_enabled, who)"
    " VALUES ('register', 'report', 'w', true, 'ops')",
)
RESTORE = Audit(
    "jobs.authority_restores",
    "authority_restores_resolved_idx",
    # resolved restore records: each may go once resolved long enough ago
    "INSERT INTO jobs.authority_restores (tenant, db_epoch, ledger_epoch, detected_by,"
    " detected_at, resolved_at, resolved_epoch) SELECT 'acme', 1, 2, 'test',"
    " now() - make_interval(secs => $2), now() - make_interval(secs => $2), 3"
    " FROM generate_series(1, $1)",
    "SELECT audit_pruned FROM jobs.prune(86400, 86400, 100)",
    setup="INSERT INTO jobs.tenants (tenant) VALUES ('acme')",
    # an open one, detected long ago, holds its tenant: never removed
    newest="INSERT INTO jobs.authority_restores (tenant, db_epoch, ledger_epoch, detected_by,"
    " detected_at) VALUES ('acme', 1, 2, 'test', now() - interval '1 year')",
)
RELEASE = Audit(
    "relay.release_audit",
    "release_audit_at_idx",
    # an outbox row published and pruned since: its audit may go once old enough
    "INSERT INTO relay.release_audit (at, tenant, event_id, outbox_id, held_reason, attempts,"
    " who, db_user, db_role, evidence) SELECT now() - make_interval(secs => $2), 'acme',"
    " gen_random_uuid(), -i, 'unroutable', 3, 'ops', 'u', 'r', 'ticket'"
    " FROM generate_series(1, $1) i",
    "SELECT relay.prune_release_audit(86400, 100)",
)


def doomed(plans: list[str], table: str) -> str:
    """The plan of the batch's statement that takes its rows from ``table``."""
    return next(p for p in plans if "WITH doomed" in p and f"FROM {table} a" in p)


def read_by_scan(plans: list[str], table: str) -> int:
    """The rows the batch's scan of ``table`` read: those it returned and those it filtered
    out (auto_explain with ANALYZE)."""
    name = table.split(".")[1]
    scan = doomed(plans, table)
    found = re.search(rf"Scan\b[^\n]* on {name} a .*?actual time=\S+ rows=(\d+)", scan)
    assert found, scan
    return int(found.group(1)) + sum(filtered_out(scan))


@pytest.mark.parametrize(
    "audit",
    [REPAIR, REGISTRATION, RESTORE, RELEASE],
    ids=["repair_audit", "registration_audit", "authority_restores", "release_audit"],
)
async def test_an_audit_pruner_reads_the_expired_rows_not_the_history_kept(
    pg: asyncpg.Connection, audit: Audit
) -> None:
    if audit.setup:
        await pg.execute(audit.setup)
    await pg.execute(audit.insert, KEPT, 60.0)
    await pg.execute(audit.insert, EXPIRED, 100 * 86400.0)
    if audit.newest:
        await pg.execute(audit.newest)
    await pg.execute(f"ANALYZE {audit.table}")

    async with logged_plans(pg) as plans:
        await pg.execute("SET auto_explain.log_analyze = on")
        # Control: without the index, the same batch reads every row kept.
        control = pg.transaction()
        await control.start()
        await pg.execute(f"DROP INDEX {audit.table.split('.')[0]}.{audit.index}")
        assert await pg.fetchval(audit.prune) == EXPIRED
        await control.rollback()
        walked = read_by_scan(plans, audit.table)
        assert walked >= KEPT + EXPIRED, plans

        plans.clear()
        async with pg.transaction():
            assert await pg.fetchval(audit.prune) == EXPIRED
    scan = doomed(plans, audit.table)
    assert audit.index in scan, scan
    assert read_by_scan(plans, audit.table) == EXPIRED, scan
    kept = KEPT + (1 if audit.newest else 0)
    assert await pg.fetchval(f"SELECT count(*) FROM {audit.table}") == kept
