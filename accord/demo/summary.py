"""What one demo run produced, read from the database (the oracle, not any process's log).

Every figure is scoped to the run's operation ids (``report:<run>-*``). ``adds_up`` is the
demo's promise: every accepted submission has a published report or a stated reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Submissions of this run: accepted, and published (a demo.reports row).
SUBMISSIONS = """
SELECT count(*) AS accepted, count(r.report_id) AS published
FROM demo.submissions s
LEFT JOIN demo.reports r USING (tenant, report_id)
WHERE s.operation_id LIKE $1
"""

# Jobs of this run by state (the consumer's submit created them).
JOBS_BY_STATE = """
SELECT state, count(*) AS n, sum(attempts) AS attempts
FROM jobs.jobs WHERE workflow = 'report' AND operation_id LIKE $1 GROUP BY state
"""

# Effect records of this run's jobs by outcome.
EFFECTS_BY_STATE = """
SELECT e.state, count(*) AS n
FROM jobs.effects e JOIN jobs.jobs j USING (job_id)
WHERE j.operation_id LIKE $1 GROUP BY e.state
"""

# Deliveries the report consumer saw for this run, by inbox outcome.
DELIVERIES = """
SELECT outcome, count(*) AS n
FROM consumers.deliveries WHERE consumer = 'report' AND operation_id LIKE $1 GROUP BY outcome
"""

# Outbox rows of this run by event type and state (accepted and published events).
OUTBOX = """
SELECT type, state, count(*) AS n FROM relay.outbox WHERE operation_id LIKE $1 GROUP BY 1, 2
"""

# The live read model (report_projection consumer) rows of this run.
PROJECTED = "SELECT count(*) FROM demo_projection.published_reports WHERE operation_id LIKE $1"

# How many of these attempts (one worker's journaled claims) still hold a running job.
RUNNING_ATTEMPTS = """
SELECT count(*) FROM jobs.jobs WHERE state = 'running' AND attempt_id = ANY($1::uuid[])
"""

# Rolled-back submissions must have left nothing anywhere: no outbox row, no job.
ROLLED_BACK_TRACES = """
SELECT (SELECT count(*) FROM relay.outbox WHERE operation_id = ANY($1::text[]))
     + (SELECT count(*) FROM jobs.jobs WHERE operation_id = ANY($1::text[]))
     + (SELECT count(*) FROM demo.submissions WHERE operation_id = ANY($1::text[]))
"""

# Jobs whose outcome waits on a person or on evidence, with the reason stated.
WAITING = """
SELECT j.job_id, j.tenant, j.operation_id, j.state,
       coalesce(string_agg(e.effect_key || '=' || e.state, ', ')
                FILTER (WHERE e.state IN ('pending', 'unknown')), '') AS unresolved,
       j.last_error
FROM jobs.jobs j LEFT JOIN jobs.effects e USING (job_id)
WHERE j.workflow = 'report' AND j.operation_id LIKE $1 AND j.state <> 'succeeded'
GROUP BY j.job_id ORDER BY j.job_id
"""

FINAL_STATES = frozenset({"succeeded", "failed", "poison", "canceled", "unknown", "held"})


@dataclass(frozen=True, slots=True)
class Summary:
    accepted: int
    published: int
    rolled_back: int
    rolled_back_traces: int
    deliveries: dict[str, int]
    jobs: dict[str, int]
    attempts: int
    effects: dict[str, int]
    outbox: dict[str, int]
    projected: int = 0
    waiting: list[dict[str, Any]] = field(default_factory=list)

    @property
    def delivered(self) -> int:
        return self.deliveries.get("new", 0)

    @property
    def settled(self) -> bool:
        """Every accepted submission reached a job, and no job is still queued or running."""
        in_jobs = sum(self.jobs.values())
        return in_jobs == self.accepted and all(s in FINAL_STATES for s in self.jobs)

    @property
    def adds_up(self) -> bool:
        """Every accepted submission has a report or a stated reason; nothing rolled back leaked."""
        reasons = len(self.waiting)
        return (
            self.settled
            and self.published + reasons == self.accepted
            and self.published == self.jobs.get("succeeded", 0)
            and self.rolled_back_traces == 0
            and self.projected == self.published
        )


async def collect(conn: Any, run: str, rolled_back_ops: list[str]) -> Summary:
    """Read-only: one consistent snapshot of the run's figures."""
    like = f"report:{run}-%"
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        subs = await conn.fetchrow(SUBMISSIONS, like)
        jobs_rows = await conn.fetch(JOBS_BY_STATE, like)
        effects = {r["state"]: r["n"] for r in await conn.fetch(EFFECTS_BY_STATE, like)}
        deliveries = {r["outcome"]: r["n"] for r in await conn.fetch(DELIVERIES, like)}
        outbox = {f"{r['type']}:{r['state']}": r["n"] for r in await conn.fetch(OUTBOX, like)}
        traces = await conn.fetchval(ROLLED_BACK_TRACES, rolled_back_ops)
        projected = await conn.fetchval(PROJECTED, like)
        waiting = [dict(r) for r in await conn.fetch(WAITING, like)]
    return Summary(
        accepted=subs["accepted"],
        published=subs["published"],
        rolled_back=len(rolled_back_ops),
        rolled_back_traces=traces,
        deliveries=deliveries,
        jobs={r["state"]: r["n"] for r in jobs_rows},
        attempts=sum(r["attempts"] or 0 for r in jobs_rows),
        effects=effects,
        outbox=outbox,
        projected=projected,
        waiting=[w for w in waiting if w["state"] in FINAL_STATES],
    )


def progress_line(s: Summary, elapsed: float) -> str:
    jobs = " ".join(f"{k}={v}" for k, v in sorted(s.jobs.items())) or "-"
    return (
        f"[{elapsed:6.1f}s] accepted={s.accepted} delivered={s.delivered} "
        f"jobs({jobs}) published={s.published}"
    )


def render(s: Summary, elapsed: float) -> str:
    def kv(d: dict[str, int]) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"

    lines = [
        "== accord demo: summary ==",
        f"accepted submissions      {s.accepted}",
        f"rolled back (never sent)  {s.rolled_back} (traces left anywhere: {s.rolled_back_traces})",
        f"delivered to 'report'     {s.delivered}",
        f"duplicates absorbed       {s.deliveries.get('duplicate', 0)}",
        f"conflicts                 {s.deliveries.get('conflict', 0)}",
        f"jobs by state             {kv(s.jobs)}",
        f"job attempts              {s.attempts} for {sum(s.jobs.values())} jobs "
        "(each extra attempt is a recovery: rescue after a lost lease, or a retry)",
        f"effects by outcome        {kv(s.effects)}",
        f"reports published         {s.published}",
        f"outbox rows               {kv(s.outbox)}",
        f"read model (projection)   {s.projected} published reports",
        f"elapsed                   {elapsed:.1f}s",
    ]
    if s.waiting:
        lines.append("waiting, with the reason:")
        for w in s.waiting:
            if w["unresolved"]:
                why = (
                    f"effect outcome unknown ({w['unresolved']}): awaiting reconciliation "
                    "(`accord reconcile`)"
                )
            elif w["state"] == "unknown":
                why = "effects resolved, result unpublished: awaiting `accord repair resume`"
            else:
                why = f"{w['state']}: {w['last_error'] or 'no error recorded'}"
            lines.append(f"  job {w['job_id']} {w['tenant']} {w['operation_id']}: {why}")
    verdict = "adds up" if s.adds_up else "DOES NOT add up"
    lines.append(
        f"every accepted submission has a report or a stated reason: {verdict} "
        f"({s.published} reports + {len(s.waiting)} stated = {s.accepted} accepted)"
    )
    return "\n".join(lines)
