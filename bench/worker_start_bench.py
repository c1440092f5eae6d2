"""A worker's start with a long journal history, rotation on, against 0.2's read-whole start;
and group commit of journal appends against one fsync per append. Same machine, same run.

    .venv/bin/python -m bench.worker_start_bench [--jobs 100000] [--million] [--unresolved 20]
        [--segment-mib 8] [--appends 4000] [--rounds 3]

Start. A scratch database (migrated, as bench.jobs_bench makes them) holds ``--jobs`` finished
jobs, each with its effect recorded ``succeeded``, and ``--unresolved`` more whose effect is
still ``pending`` (begun, outcome never recorded; the oldest history). Two journals hold the
same history, each job's claim, effect begin, effect outcome and publish as the worker writes
them, from 64 concurrent jobs:

* ``0.2, read whole``: one version-1 file, never rotated. Its start is 0.2's: ``Journal.open``
  reads the file whole, then 0.2's ``report_unrecorded`` (every effect record parsed, one
  query for every job ever begun).
* ``rotated``: written through ``RunnerJournal.write`` (group commit) and sealed whenever its
  live segment passed ``--segment-mib`` (``recovery.rotate_journal``, as the worker's journal
  loop calls it: the database asked, the unresolved effects carried forward). Its start is
  ``open_journal``, ``report_unrecorded`` and ``seal_at_start`` (this release's, which the
  Worker runs before claiming), on the live segment as the history left it, and again with
  the live segment filled to its bound (a worker killed just before a rotation: the worst
  case).

Each start runs in a fresh interpreter on a copy of its journal, connected first; the figures
are its wall time and its peak RSS (``VmHWM``: ``getrusage`` maxrss would count the parent's
RSS at fork), also above a bare interpreter with the same imports and connection. Each must
find exactly the unresolved effects. ``--million`` adds a run with 1,000,000 jobs (about
fifteen minutes here, and several GB of memory for the 0.2 start).

Group commit. ``--appends`` records, four per job, written by 4 and then 16 concurrent jobs:
``grouped`` through ``RunnerJournal.write`` (one write and one fsync per group), ``per-append``
through 0.2's path (a thread hop, then a write and an fsync per record: ``Journal.append``),
and ``raw``, a bare ``pwrite`` + ``fsync`` loop of frames of the same size in one thread (the
floor of any journal that fsyncs each append). Prints records/s, CPU per record (every
thread), fsyncs per job and the ratios; medians over ``--rounds``, every second round in
reverse order.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
import asyncpg

from accord.jobs.framing import Journal, encode_header, encode_payload, frame_payload
from accord.jobs.models import EffectState
from accord.jobs.runner import recovery
from accord.jobs.runner.journal import RunnerJournal
from accord.jobs.runner.journal_records import Claim, EffectBegin, EffectOutcome, Publish
from accord.runtime import run
from bench.jobs_bench import drop_database, fresh_database

ROOT = Path(__file__).resolve().parents[1]
RUNNER, TENANT, WORKFLOW = "bench-w1", "t", "bench"
HISTORY_CONCURRENCY = 64
ATTEMPT = uuid.UUID("6f0c5b8e-3d1a-4c2b-9e7f-0a1b2c3d4e5f")

# Jobs 1..$1 with their keys; effects 1..$1 succeeded, then $1+1..$1+$2 still pending.
SETUP = [
    "INSERT INTO jobs.tenants (tenant) VALUES ('t')",
    """INSERT INTO jobs.operations (tenant, workflow, operation_id, job_id)
       SELECT 't', 'bench', 'op-' || i, i FROM generate_series(1, $1::int + $2::int) i""",
    """INSERT INTO jobs.jobs (job_id, tenant, workflow, operation_id, digest, state, generation,
                              attempts)
       OVERRIDING SYSTEM VALUE
       SELECT i, 't', 'bench', 'op-' || i, 'd', CASE WHEN i <= $1::int THEN 'succeeded'
              ELSE 'unknown' END, 1, 1 FROM generate_series(1, $1::int + $2::int) i""",
    """INSERT INTO jobs.effects (tenant, job_id, effect_key, seq, intent_digest, state, receipt,
                                 attempt_id, generation)
       SELECT 't', i, 'send', 1, 'digest',
              CASE WHEN i <= $1::int THEN 'succeeded' ELSE 'pending' END,
              CASE WHEN i <= $1::int THEN 'rcpt-' || i END,
              '6f0c5b8e-3d1a-4c2b-9e7f-0a1b2c3d4e5f', 1
       FROM generate_series(1, $1::int + $2::int) i""",
]

START = r"""
import json, sys, time
import anyio, asyncpg
from accord.jobs.framing import Journal
from accord.jobs.runner import recovery
from accord.jobs.runner.journal import effect_of
from accord.jobs.runner.journal_records import EffectRef, unrecorded_effects

# 0.2's query: every effect row of every job the journal ever began.
RECORDED_EFFECTS_0_2 = (
    "SELECT job_id, effect_key, seq FROM jobs.effects"
    " WHERE job_id = ANY($1::bigint[]) AND state <> 'pending'"
)

def peak_mb():
    # VmHWM, this process's own peak RSS: getrusage's maxrss would include the parent's RSS
    # at fork (Linux keeps it across execve), a floor under every small figure.
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) for l in status if l.startswith("VmHWM")) / 1024

async def main(mode, path, dsn, runner):
    conn = await asyncpg.connect(dsn)
    started = time.perf_counter()
    if mode == "0.2":
        # 0.2's start: Journal.open reads the whole file; report_unrecorded as 0.2 wrote it
        # (every record of every begun job parsed, one query for every job ever begun).
        journal = Journal.open(path, runner)
        records = journal.scan.records
        job_ids = sorted({r["job_id"] for r in records if r.get("type") == "effect_begin"})
        rows = await conn.fetch(RECORDED_EFFECTS_0_2, job_ids)
        done = {EffectRef(r["job_id"], r["effect_key"], r["seq"]) for r in rows}
        begins = (effect_of(r)[1] for r in records if r.get("type") == "effect_begin")
        recorded = {b for b in begins if b is not None and b.ref in done}
        found = unrecorded_effects(records, recorded)
    elif mode == "bare":  # what an interpreter holds with these imports and a connection
        journal, found = None, []
    else:
        journal = recovery.open_journal(path, runner)
        found = await recovery.report_unrecorded(conn, journal)
        await recovery.seal_at_start(journal, found)
    elapsed = time.perf_counter() - started
    peak = peak_mb()
    if journal is not None:
        journal.close()
    await conn.close()
    print(json.dumps({"s": elapsed, "peak_mb": peak, "found": len(found)}))

anyio.run(main, *sys.argv[1:5])
"""


def modelled_records(job_id: int, *, pending: bool = False) -> list[dict[str, Any]]:
    """One job's records as the worker journals them (a pending one's outcome is unknown)."""
    ids: dict[str, Any] = {"tenant": TENANT, "job_id": job_id, "attempt_id": ATTEMPT}
    ids["generation"] = 1
    outcome = EffectState.UNKNOWN if pending else EffectState.SUCCEEDED
    records: list[Any] = [
        Claim(**ids),
        EffectBegin(
            **ids,
            effect_key="send",
            seq=1,
            idempotency_key=f"op-{job_id}:send",
            intent_digest="sha256-" + "ab" * 32,
        ),
        EffectOutcome(
            **ids,
            effect_key="send",
            seq=1,
            outcome=outcome,
            receipt=None if pending else f"rcpt-{job_id}",
        ),
    ]
    if not pending:
        records.append(Publish(**ids, object_key="sha256-" + "cd" * 32))
    return [r.model_dump(mode="json") for r in records]


_TEMPLATES = {pending: modelled_records(1, pending=pending) for pending in (False, True)}


def job_records(job_id: int, *, pending: bool = False) -> list[dict[str, Any]]:
    """:func:`modelled_records`, fast (a million jobs are four million records)."""
    records = []
    for template in _TEMPLATES[pending]:
        record = {**template, "job_id": job_id}
        if "idempotency_key" in record:
            record["idempotency_key"] = f"op-{job_id}:send"
        if record.get("receipt"):
            record["receipt"] = f"rcpt-{job_id}"
        records.append(record)
    return records


def history(jobs: int, unresolved: int) -> list[int]:
    """The job ids in journal order: the unresolved ones first (the oldest history)."""
    return [*range(jobs + 1, jobs + unresolved + 1), *range(1, jobs + 1)]


def write_whole(path: Path, order: list[int], jobs: int) -> None:
    """0.2's journal: one version-1 file (written in bulk: only its contents matter here)."""
    with path.open("wb") as f:
        f.write(encode_header(RUNNER))
        chunk: list[bytes] = []
        for job_id in order:
            for record in job_records(job_id, pending=job_id > jobs):
                chunk.append(frame_payload(encode_payload(record)))
            if len(chunk) > 4096:
                f.write(b"".join(chunk))
                chunk.clear()
        f.write(b"".join(chunk))
        f.flush()
        os.fsync(f.fileno())


async def write_rotated(
    path: Path, order: list[int], jobs: int, dsn: str, segment_bytes: int
) -> tuple[int, int]:
    """This release's journal: written by concurrent jobs through group commit, sealed as the
    worker's journal loop seals it. Returns (rotations, groups)."""
    journal = RunnerJournal.open(path, RUNNER, segment_bytes=segment_bytes)
    conn = await asyncpg.connect(dsn)
    done = anyio.Event()

    async def jobs_from(k: int) -> None:
        for job_id in order[k::HISTORY_CONCURRENCY]:
            for record in job_records(job_id, pending=job_id > jobs):
                await journal.write(record)

    async def journal_loop() -> None:
        while not done.is_set():
            if journal.rotation_due:
                await recovery.rotate_journal(conn, journal)
            await anyio.sleep(0.05)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(journal_loop)
            async with anyio.create_task_group() as writers:
                for k in range(HISTORY_CONCURRENCY):
                    writers.start_soon(jobs_from, k)
            done.set()
        return journal.stats.rotations, journal.stats.groups
    finally:
        journal.close()
        await conn.close()


def start(mode: str, journal: Path, dsn: str) -> dict[str, Any]:
    """One start in a fresh interpreter, on a copy of ``journal`` (a start rotates it)."""
    with tempfile.TemporaryDirectory(dir=journal.parent) as scratch:
        copy = Path(scratch) / journal.name
        shutil.copyfile(journal, copy)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [sys.executable, "-c", START, mode, str(copy), dsn, RUNNER],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def fill_live_segment(path: Path, segment_bytes: int) -> None:
    """Grow the live segment to its bound with more finished jobs, without rotating: the
    journal a worker leaves when it is killed just before a rotation (a start's worst case)."""
    with Journal.open(path, RUNNER) as journal:
        scan, job_id = journal.scan, 0
        # What the live segment holds beyond its carried records counts against the bound.
        fresh = scan.offsets[scan.carried] if scan.carried < len(scan.offsets) else scan.end
        while journal.end - fresh < segment_bytes:
            batch = []
            for _ in range(256):
                job_id += 1
                batch += [encode_payload(r) for r in job_records(job_id)]
            journal.append_payloads(batch)


async def bench_start(
    admin: str, work: Path, jobs: int, unresolved: int, segment_bytes: int
) -> None:
    dsn = await fresh_database(admin)
    try:
        started = time.perf_counter()
        conn = await asyncpg.connect(dsn)
        try:
            async with conn.transaction():
                for statement in SETUP:
                    args = (jobs, unresolved) if "$1" in statement else ()
                    await conn.execute(statement, *args)
            await conn.execute("VACUUM ANALYZE jobs.effects, jobs.jobs")
        finally:
            await conn.close()
        for pending in (False, True):  # the fast records are the worker's records
            assert job_records(7, pending=pending) == modelled_records(7, pending=pending)
        order = history(jobs, unresolved)
        whole, rotated = work / f"whole-{jobs}.journal", work / f"rotated-{jobs}.journal"
        await anyio.to_thread.run_sync(write_whole, whole, order, jobs)
        rotations, groups = await write_rotated(rotated, order, jobs, dsn, segment_bytes)
        full = work / f"full-{jobs}.journal"
        shutil.copyfile(rotated, full)
        await anyio.to_thread.run_sync(fill_live_segment, full, segment_bytes)
        mib = {p: p.stat().st_size / 2**20 for p in (whole, rotated, full)}
        print(
            f"  history of {jobs} jobs (+{unresolved} unresolved) written in"
            f" {time.perf_counter() - started:.0f} s: the 0.2 file {mib[whole]:.0f} MiB; rotated"
            f" {rotations} times ({groups} groups), live segment {mib[rotated]:.1f} MiB"
            f" (filled to its bound: {mib[full]:.1f} MiB)"
        )
        bare = (await anyio.to_thread.run_sync(start, "bare", whole, dsn))["peak_mb"]
        figures = {}
        for name, mode, path in (
            ("0.2, read whole", "0.2", whole),
            ("rotated", "rotated", rotated),
            ("rotated, full segment", "rotated", full),
        ):
            figures[name] = got = await anyio.to_thread.run_sync(start, mode, path, dsn)
            assert got["found"] == unresolved, got  # each finds exactly the unresolved effects
            print(
                f"  start {name:>21}: {got['s']:7.2f} s, peak RSS {got['peak_mb']:6.0f} MB"
                f" ({got['peak_mb'] - bare:6.0f} MB above a bare process)"
            )
        old = figures["0.2, read whole"]
        for name in ("rotated", "rotated, full segment"):
            new = figures[name]
            extra = max(new["peak_mb"] - bare, 1) / max(old["peak_mb"] - bare, 1)
            print(f"  {name} / 0.2: time {new['s'] / old['s']:.3f}, memory {extra:.3f}")
    finally:
        await drop_database(admin, dsn)


def _frame_records(n: int) -> list[dict[str, Any]]:
    return [r for job_id in range(1, n // 4 + 1) for r in job_records(job_id)]


async def _concurrently(
    jobs: int, writer: Callable[[dict[str, Any]], Coroutine[Any, Any, None]], records: list[Any]
) -> float:
    per_job = 4
    started = time.perf_counter()

    async def one(k: int) -> None:
        for j in range(k, len(records) // per_job, jobs):
            for record in records[j * per_job : (j + 1) * per_job]:
                await writer(record)

    async with anyio.create_task_group() as tg:
        for k in range(jobs):
            tg.start_soon(one, k)
    return time.perf_counter() - started


def raw_fsync(path: Path, frame: bytes, n: int) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        started = time.perf_counter()
        offset = 0
        for _ in range(n):
            os.pwrite(fd, frame, offset)
            os.fsync(fd)
            offset += len(frame)
        return time.perf_counter() - started
    finally:
        os.close(fd)


async def bench_group_commit(work: Path, n: int, rounds: int) -> None:
    records = _frame_records(n)
    n, jobs = len(records), len(records) / 4
    frame = frame_payload(encode_payload(records[1]))
    for concurrency in (4, 16):
        times: dict[str, list[float]] = {"grouped": [], "per-append": [], "raw": []}
        cpu: dict[str, list[float]] = {variant: [] for variant in times}
        groups = 0
        for round_ in range(rounds):
            # Every second round in reverse order, so that a drifting disk favours no side.
            order = list(times) if round_ % 2 == 0 else list(reversed(times))
            for variant in order:
                path = work / f"{variant}-{concurrency}-{round_}.journal"
                cpu_before = time.process_time()  # every thread of this process
                if variant == "raw":
                    elapsed = await anyio.to_thread.run_sync(raw_fsync, path, frame, n)
                elif variant == "grouped":
                    with RunnerJournal.open(path, RUNNER) as grouped:
                        elapsed = await _concurrently(concurrency, grouped.write, records)
                    groups = grouped.stats.groups
                else:
                    with Journal.open(path, RUNNER) as single:

                        async def one_by_one(record: dict[str, Any], j: Journal = single) -> None:
                            await anyio.to_thread.run_sync(j.append, record)  # 0.2's _append

                        elapsed = await _concurrently(concurrency, one_by_one, records)
                times[variant].append(elapsed)
                cpu[variant].append(time.process_time() - cpu_before)
        g, s, r = (statistics.median(times[v]) for v in ("grouped", "per-append", "raw"))
        us = {v: statistics.median(cpu[v]) / n * 1e6 for v in cpu}
        print(
            f"  {concurrency:>2} jobs: grouped {n / g:5.0f} records/s, {us['grouped']:3.0f} µs"
            f" CPU each, {groups / jobs:.2f} fsyncs/job | per-append {n / s:5.0f}/s,"
            f" {us['per-append']:3.0f} µs, 4.00 fsyncs/job | raw pwrite+fsync {n / r:5.0f}/s,"
            f" {us['raw']:3.0f} µs\n"
            f"           grouped / per-append {s / g:.2f} (CPU"
            f" {us['grouped'] / us['per-append']:.2f}), grouped / raw {r / g:.2f},"
            f" per-append / raw {r / s:.2f}"
        )


async def main(args: argparse.Namespace) -> None:
    admin = os.environ.get("ACCORD_PG_DSN_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
    sizes = [args.jobs, *([1_000_000] if args.million else [])]
    segment_bytes = int(args.segment_mib * 2**20)
    with tempfile.TemporaryDirectory(prefix="accord-start-bench-") as tmp:
        work = Path(tmp)
        print(f"group commit: {args.appends} records, 4 per job")
        await bench_group_commit(work, args.appends, args.rounds)
        for jobs in sizes:
            print(f"worker start, {jobs} jobs of history, segments of {args.segment_mib:g} MiB")
            await bench_start(admin, work, jobs, args.unresolved, segment_bytes)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--million", action="store_true", help="also 1,000,000 jobs (minutes)")
    parser.add_argument("--unresolved", type=int, default=20)
    parser.add_argument("--segment-mib", type=float, default=8.0)
    parser.add_argument("--appends", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3, help="group commit rounds (median)")
    run(main, parser.parse_args())


if __name__ == "__main__":
    cli()
