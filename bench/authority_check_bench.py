"""What one pass of the authority watch costs a worker as the authority ledger's history grows:
the ledger kept between passes against read whole at every pass, next to the floor of the
pass, in the same run.

    .venv/bin/python -m bench.authority_check_bench [--tenants 20000] [--epochs 5] [--passes 5]

A scratch database (migrated, as bench.jobs_bench makes them) holds ``--tenants`` tenants at
epoch ``--epochs``; each ledger holds the history that brought them there, ``--epochs``
records per tenant (tenants x epochs records in all: rotations, restrictions, observations),
so the database is never behind it and a pass detects nothing. Two ledgers, each through the
worker's own ``check_restore`` (what ``authority_watch`` runs every ACCORD_AUTHORITY_CHECK_S,
10 s by default):

* ``file``: a FileLedger in a temporary directory; ``pg``: a PgLedger in a second scratch
  database (never the guarded one).
* ``whole``: a new ledger handle at each pass, so each pass reads the ledger whole (as every
  pass did before the ledgers kept their reads); ``kept``: one handle for every pass (its
  first read, whole, is not timed), as the watch holds it now.
* ``floor``: the pass's own database read alone (every tenant's epoch, ``TENANTS``), which a
  pass needs whatever the ledger does.

Then one record appended to the file ledger (what a rotation, a restriction or a pass that
sees a new tenant writes, under the lock every writer waits for): by a new handle, which
verifies the whole file (``append_whole``, as every append did before appends trusted their
handle's verified prefix), and by the kept handle (``append_kept``), against an append to a
ledger holding one record (``append_floor``: the lock, the write and its fsync).

Figures: the process's CPU per pass (every thread: a file ledger reads on a worker thread) and
wall time, medians over ``--passes``, each pass after a full garbage collection (what an earlier
pass left is not its cost); ratios against the floor. Prints one JSON document, then
a summary.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from accord.jobs import repair_sql
from accord.jobs.authority import check_restore
from accord.jobs.ledger import FileLedger, Ledger, LedgerRecord, LedgerWhy, PgLedger
from accord.runtime import run
from bench.jobs_bench import drop_database, fresh_database, with_database


def history(tenants: int, epochs: int) -> list[LedgerRecord]:
    """Each tenant's records from epoch 1 to ``epochs``, interleaved as they would accrue."""
    return [
        LedgerRecord(
            tenant=f"t{t}",
            epoch=e,
            frozen=False,
            why=LedgerWhy.OBSERVED if e == 1 else LedgerWhy.ROTATE,
        )
        for e in range(1, epochs + 1)
        for t in range(tenants)
    ]


async def timed(passes: int, one: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    cpu, wall = [], []
    for _ in range(passes):
        gc.collect()  # the garbage an earlier pass left is not this pass's cost
        c, w = time.process_time(), time.perf_counter()
        await one()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return {"cpu_ms": statistics.median(cpu) * 1e3, "wall_ms": statistics.median(wall) * 1e3}


async def bench_ledger(
    name: str, pool: asyncpg.Pool, handle: Callable[[], Ledger], passes: int
) -> dict[str, dict[str, float]]:
    async def whole() -> None:
        assert await check_restore(pool, handle()) == []

    kept = handle()
    await check_restore(pool, kept)  # its first read is whole

    async def again() -> None:
        assert await check_restore(pool, kept) == []

    out = {"whole": await timed(passes, whole), "kept": await timed(passes, again)}
    print(f"  {name}: whole {out['whole']['cpu_ms']:.1f} ms CPU, kept {out['kept']['cpu_ms']:.1f}")
    return out


async def bench_append(path: Path, floor: Path, passes: int) -> dict[str, dict[str, float]]:
    """One record appended (for a tenant the database does not hold: after the passes)."""
    epochs = iter(range(1, 1_000_000))

    def one() -> LedgerRecord:
        return LedgerRecord(
            tenant="bench-append", epoch=next(epochs), frozen=False, why=LedgerWhy.ROTATE
        )

    kept = FileLedger(path)
    await kept.read()
    small = FileLedger(floor)
    await small.append(one())

    async def whole() -> None:
        await FileLedger(path).append(one())

    out = {
        "append_floor": await timed(passes, lambda: small.append(one())),
        "append_whole": await timed(passes, whole),
        "append_kept": await timed(passes, lambda: kept.append(one())),
    }
    for how in ("whole", "kept"):
        out[f"append_{how}"]["x_floor"] = (
            out[f"append_{how}"]["cpu_ms"] / out["append_floor"]["cpu_ms"]
        )
    print(
        f"  file append: whole {out['append_whole']['cpu_ms']:.1f} ms CPU,"
        f" kept {out['append_kept']['cpu_ms']:.1f}, floor {out['append_floor']['cpu_ms']:.1f}"
    )
    return out


async def main(args: argparse.Namespace) -> None:
    admin = os.environ.get("ACCORD_PG_DSN_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
    dsn = await fresh_database(admin)
    ledger_dsn = with_database(admin, f"accord_bench_ledger_{os.getpid()}")
    records = history(args.tenants, args.epochs)
    result: dict[str, Any] = {"tenants": args.tenants, "records": len(records)}
    try:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(f'CREATE DATABASE "{ledger_dsn.rsplit("/", 1)[1]}"')
        finally:
            await conn.close()
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
        try:
            await pool.execute(
                "INSERT INTO jobs.tenants (tenant, epoch)"
                " SELECT 't' || i, $2 FROM generate_series(0, $1 - 1) i",
                args.tenants,
                args.epochs,
            )
            with tempfile.TemporaryDirectory(prefix="accord-ledger-bench-") as tmp:
                path = Path(tmp) / "authority.ledger"
                for i in range(0, len(records), 10_000):
                    FileLedger(path).append_sync(*records[i : i + 10_000])
                pg = PgLedger(ledger_dsn)
                await pg.ensure()
                for i in range(0, len(records), 10_000):
                    await pg.append(*records[i : i + 10_000])
                result["ledger_bytes"] = path.stat().st_size
                print(
                    f"authority check: {args.tenants} tenants, {len(records)} ledger records"
                    f" ({result['ledger_bytes']} B), {args.passes} passes"
                )

                async def floor() -> None:
                    async with pool.acquire() as c:
                        {row["tenant"]: row for row in await c.fetch(repair_sql.TENANTS)}

                result["floor"] = await timed(args.passes, floor)
                print(f"  floor (the tenants' epochs alone): {result['floor']['cpu_ms']:.1f} ms")
                result["file"] = await bench_ledger(
                    "file", pool, lambda: FileLedger(path), args.passes
                )
                result["append"] = await bench_append(path, Path(tmp) / "floor", args.passes)
                result["pg"] = await bench_ledger(
                    "pg", pool, lambda: PgLedger(ledger_dsn), args.passes
                )
        finally:
            await pool.close()
    finally:
        await drop_database(admin, dsn)
        await drop_database(admin, ledger_dsn)
    floor_cpu = result["floor"]["cpu_ms"]
    for kind in ("file", "pg"):
        for how in ("whole", "kept"):
            result[kind][how]["x_floor"] = result[kind][how]["cpu_ms"] / floor_cpu
    print(json.dumps(result, indent=2))
    for kind in ("file", "pg"):
        w, k = result[kind]["whole"], result[kind]["kept"]
        print(
            f"{kind} ledger: a pass costs {k['cpu_ms']:.1f} ms of CPU kept ({k['x_floor']:.2f} x"
            f" the floor), {w['cpu_ms']:.1f} ms read whole ({w['x_floor']:.2f} x);"
            f" wall {k['wall_ms']:.1f} against {w['wall_ms']:.1f} ms"
        )
    a = result["append"]
    print(
        f"file ledger: an append costs {a['append_kept']['cpu_ms']:.2f} ms of CPU kept"
        f" ({a['append_kept']['x_floor']:.2f} x an append to a one-record ledger),"
        f" {a['append_whole']['cpu_ms']:.1f} ms verifying the whole file"
        f" ({a['append_whole']['x_floor']:.1f} x); wall {a['append_kept']['wall_ms']:.2f}"
        f" against {a['append_whole']['wall_ms']:.1f} ms (floor {a['append_floor']['wall_ms']:.2f})"
    )


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=5, help="ledger records per tenant")
    parser.add_argument("--passes", type=int, default=5, help="timed passes (median)")
    run(main, parser.parse_args())


if __name__ == "__main__":
    cli()
