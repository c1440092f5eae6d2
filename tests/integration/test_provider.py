"""The provider simulator over real loopback HTTP: idempotency, lookup, faults, durable evidence."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from accord.demo.provider import (
    Fault,
    ProviderAmbiguous,
    ProviderClient,
    ProviderConflict,
    ProviderLookupFailed,
    ProviderRefused,
    ProviderServer,
)
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
BODY = {"report": "q3", "rows": 12}


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ProviderServer]:
    async with ProviderServer(tmp_path / "evidence.sqlite") as running:
        yield running


@pytest.fixture
def client(server: ProviderServer) -> ProviderClient:
    return ProviderClient(server.url, timeout_s=5.0)


async def test_serves_on_loopback_only(server: ProviderServer) -> None:
    assert server.url.startswith("http://127.0.0.1:")


async def test_same_key_returns_the_original_receipt_and_records_nothing_new(
    server: ProviderServer, client: ProviderClient
) -> None:
    first = await client.create_report("op-1:send", BODY)
    assert not first.replayed and first.receipt_id.startswith("rcpt-")
    again = await client.create_report("op-1:send", BODY)
    assert again == first and again.replayed
    other = await client.create_report("op-2:send", BODY)
    assert other.receipt_id != first.receipt_id
    assert server.evidence() == [first, other]
    assert await client.stats() == {"accepted": 2, "replayed": 1, "refused": 0, "dropped": 0}
    with pytest.raises(ProviderConflict):
        await client.create_report("op-1:send", {**BODY, "rows": 13})
    assert await client.evidence() == [first, other]


async def test_concurrent_creates_with_one_key_accept_exactly_once(
    server: ProviderServer, client: ProviderClient
) -> None:
    receipts = []

    async def create() -> None:
        receipts.append(await client.create_report("op-race", BODY))

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(create)
    assert len({r.receipt_id for r in receipts}) == 1
    assert sum(not r.replayed for r in receipts) == 1
    assert len(server.evidence()) == 1


async def test_lookup_by_idempotency_key(client: ProviderClient) -> None:
    key = "tenant a/op 7:send é?&#"
    assert await client.lookup(key) is None
    receipt = await client.create_report(key, BODY)
    assert await client.lookup(key) == receipt


async def test_fail_before_accept_records_nothing_and_is_safe_to_retry(
    server: ProviderServer, client: ProviderClient
) -> None:
    with pytest.raises(ProviderRefused):
        await client.create_report("op-3", BODY, fault=Fault.FAIL_BEFORE_ACCEPT)
    assert await client.lookup("op-3") is None and server.evidence() == []
    # Global, for the next request only: refused once, then the retry is accepted.
    server.set_fault(Fault.FAIL_BEFORE_ACCEPT, times=1)
    with pytest.raises(ProviderRefused):
        await client.create_report("op-3", BODY)
    receipt = await client.create_report("op-3", BODY)
    assert not receipt.replayed and server.evidence() == [receipt]


async def test_drop_after_accept_is_ambiguous_and_the_lookup_finds_the_receipt(
    server: ProviderServer, client: ProviderClient
) -> None:
    with pytest.raises(ProviderAmbiguous):
        await client.create_report("op-4", BODY, fault=Fault.DROP_AFTER_ACCEPT)
    found = await client.lookup("op-4")
    assert found is not None and server.evidence() == [found]
    retried = await client.create_report("op-4", BODY)  # the same key: no second report
    assert retried == found and retried.replayed
    assert len(server.evidence()) == 1
    assert (await client.stats())["dropped"] == 1


async def test_slow_answer_past_the_client_timeout_is_ambiguous(
    server: ProviderServer, client: ProviderClient
) -> None:
    receipt = await client.create_report("op-5a", BODY, fault=Fault.SLOW, delay_s=0.2)
    assert not receipt.replayed  # control: a slow answer within the timeout is a receipt
    impatient = ProviderClient(server.url, timeout_s=0.3)
    server.set_fault(Fault.SLOW, delay_s=3.0)
    with pytest.raises(ProviderAmbiguous):
        await impatient.create_report("op-5b", BODY)
    server.set_fault(Fault.NONE)
    found = await client.lookup("op-5b")
    assert found is not None and found.idempotency_key == "op-5b"


async def test_nobody_listening_is_a_refusal() -> None:
    client = ProviderClient(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ProviderRefused):
        await client.create_report("op-6", BODY)
    with pytest.raises(ProviderLookupFailed):
        await client.lookup("op-6")


# -- as a separate process -------------------------------------------------------------------


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def start_process(procs: list[subprocess.Popen[str]], db: Path, *args: str) -> str:
    proc = subprocess.Popen(
        [sys.executable, "-m", "accord.demo.provider", "--port", "0", "--db", str(db), *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("provider listening on http://127.0.0.1:"), line
    return line.split()[3]


@pytest.mark.timeout(60)
async def test_evidence_survives_kill_9_and_restart_of_the_process(
    tmp_path: Path, spawn: list[subprocess.Popen[str]]
) -> None:
    db = tmp_path / "evidence.sqlite"
    client = ProviderClient(start_process(spawn, db))
    receipts = [await client.create_report(f"op-{i}", {**BODY, "i": i}) for i in range(5)]
    with pytest.raises(ProviderAmbiguous):
        await client.create_report("op-dropped", BODY, fault=Fault.DROP_AFTER_ACCEPT)
    spawn[0].send_signal(signal.SIGKILL)
    spawn[0].wait()

    client = ProviderClient(start_process(spawn, db))
    for i, receipt in enumerate(receipts):
        assert await client.lookup(f"op-{i}") == receipt
    dropped = await client.lookup("op-dropped")
    assert dropped is not None
    replay = await client.create_report("op-0", {**BODY, "i": 0})
    assert replay == receipts[0] and replay.replayed
    assert await client.evidence() == [*receipts, dropped]

    spawn[1].send_signal(signal.SIGTERM)  # a graceful stop exits 0
    assert spawn[1].wait(timeout=20) == 0


@pytest.mark.timeout(60)
async def test_process_fault_flags_and_admin_fault(
    tmp_path: Path, spawn: list[subprocess.Popen[str]]
) -> None:
    url = start_process(spawn, tmp_path / "e.sqlite", "--fault", "fail_before_accept")
    client = ProviderClient(url)
    with pytest.raises(ProviderRefused):
        await client.create_report("op-1", BODY)
    await client.set_fault(Fault.NONE)
    assert not (await client.create_report("op-1", BODY)).replayed
    await client.set_fault(Fault.DROP_AFTER_ACCEPT, times=1)
    with pytest.raises(ProviderAmbiguous):
        await client.create_report("op-2", BODY)
    assert (await client.create_report("op-2", BODY)).replayed
