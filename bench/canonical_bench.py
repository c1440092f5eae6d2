"""The digest's canonical JSON: accord's fast path against ``rfc8785.dumps`` in the same run.

``python -m bench.canonical_bench [--n N]`` prints µs per document for a demo-sized digest
document and a larger payload-shaped one, and the ratio (rfc8785 / fast path).
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any

import rfc8785

from accord.schemas import canonical

DOCUMENTS: dict[str, dict[str, Any]] = {
    "digest of a report.accepted.v1": {
        "tenant": "acme", "operation_id": "report:abc-0001", "type": "report.accepted",
        "version": 1, "authority_epoch": 3,
        "material": {"report_id": "abc-0001", "subject": "quarterly figures #12 for the board"},
    },
    "a 40-field payload": {f"field_{i:02d}": ["value", i, i % 2 == 0, None] for i in range(40)},
}  # fmt: skip


def _best(dumps: Callable[[Any], bytes], document: dict[str, Any], n: int) -> float:
    return min(timeit.repeat(lambda: dumps(document), number=n, repeat=3)) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20_000)
    n = parser.parse_args().n
    for name, document in DOCUMENTS.items():
        assert canonical.dumps(document) == rfc8785.dumps(document)
        raw = _best(rfc8785.dumps, document, n)
        fast = _best(canonical.dumps, document, n)
        print(f"{name:34s} rfc8785 {raw * 1e6:7.1f} µs  fast path {fast * 1e6:6.1f} µs"
              f"  ratio {raw / fast:4.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
