"""The Python of one enqueue, without the database: what ``relay.enqueue`` does before and
around its one statement, against the least any enqueue does in the same run.

    .venv/bin/python -m bench.enqueue_prep_bench [--n 20000]

``enqueue`` runs against a stand-in connection whose ``fetchval`` returns at once (the
statement's own cost is ``bench.relay_bench``'s). Printed in µs per enqueue (best of 5):
the event's construction (``Event(...)``, the caller's), ``enqueue`` (validation, body,
digest, the create span while tracing, the parameters), their parts, and the floor: the
body written by ``orjson`` (the fastest encoder here, the one enqueue uses) and a SHA-256 of
it. Tracing off (no tracer provider), as a process without an exporter runs. Goal (#19): the
preparation below ≈ 15 µs. A tight loop keeps every cache warm: what the same Python costs
between two awaits of a real transaction is ``bench.relay_bench``'s figure ("enqueue's
Python in the transaction").
"""

from __future__ import annotations

import argparse
import hashlib
import timeit
from collections.abc import Callable
from typing import Any

import orjson

from accord.demo.catalog import demo_catalog
from accord.relay import enqueue
from accord.schemas.events import Event, encode_payload

CATALOG = demo_catalog()
PAYLOAD = {"report_id": "abc-0001", "subject": "quarterly figures #12 for the board"}


class _Connection:
    """Stands in for an asyncpg connection inside a transaction; answers at once."""

    def is_in_transaction(self) -> bool:
        return True

    async def fetchval(self, *args: Any) -> int:
        return 1


def _event() -> Event:
    return Event(tenant="acme", operation_id="report:abc-0001", type="report.accepted", version=1,
                 payload=dict(PAYLOAD))  # fmt: skip


def _best_us(call: Callable[[], Any], n: int) -> float:
    for _ in range(min(n, 2000)):
        call()
    return min(timeit.repeat(call, number=n, repeat=5)) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    n = parser.parse_args().n
    conn: Any = _Connection()
    event = _event()

    def one_enqueue() -> None:
        coro = enqueue(conn, event, catalog=CATALOG)
        try:
            coro.send(None)  # nothing awaits for real: it returns at the first step
        except StopIteration:
            return
        raise AssertionError("enqueue awaited something")

    parts = {
        "Event(...) (the caller's)": _event,
        "enqueue": one_enqueue,
        "  Catalog.validate": lambda: CATALOG.validate(event, producing=True),
        "  encode_payload": lambda: encode_payload(event, checked=True),
        "  Catalog.digest (as enqueue: plain)": lambda: CATALOG.digest(event, plain=True),
    }
    floor = _best_us(lambda: hashlib.sha256(orjson.dumps(PAYLOAD)).hexdigest(), n)
    results = {name: _best_us(call, n) for name, call in parts.items()}
    for name, us in results.items():
        print(f"{name:30s} {us:6.2f} µs")
    print(f"{'floor: orjson.dumps + sha256':30s} {floor:6.2f} µs")
    total = results["Event(...) (the caller's)"] + results["enqueue"]
    print(f"event + enqueue {total:.1f} µs, {total / floor:.1f} x the floor; enqueue alone"
          f" {results['enqueue']:.1f} µs (goal: preparation below ~15 µs)")  # fmt: skip


if __name__ == "__main__":
    main()
