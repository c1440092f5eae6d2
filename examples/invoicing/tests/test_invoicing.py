"""The invoicing application end to end, through real `accord` processes.

Each test gets its own database, broker prefix and two in-process simulators (mailer and
archive). Invoices are issued in their own transactions; each simulator drops one reply
after accepting it, so two jobs end ``unknown`` (one on ``mail.send``, one on
``archive.store``). `accord reconcile` then asks each effect's OWN provider only: the oracle
is the database (jobs, effects, the repair audit, the app's tables) and the simulators' own
evidence (one accepted request per invoice and service: idempotency held).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aio_pika
import anyio
import asyncpg
import pytest

from examples.invoicing.app import app, issue_invoice
from examples.invoicing.mailer import (
    Fault,
    MailAmbiguous,
    MailConflict,
    MailRefused,
    ServiceClient,
    ServiceSimulator,
)

ROOT = Path(__file__).resolve().parents[3]
ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
N = 6
TENANT = "acme"
SETTLE_TIMEOUT_S = 60.0


@dataclass
class Stack:
    """One running invoicing deployment: its database, simulators and accord processes."""

    tmp: Path
    dsn: str
    env: dict[str, str]
    mailer: ServiceSimulator
    archive: ServiceSimulator
    conn: asyncpg.Connection
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: list[IO[bytes]] = field(default_factory=list)

    async def accord(self, *args: str, **extra_env: str) -> str:
        """Run one `accord` command to completion; its stdout (fails on a non-zero exit)."""
        with anyio.fail_after(90):
            done = await anyio.run_process(
                [sys.executable, "-m", "accord", *args],
                env={**self.env, **extra_env},
                cwd=ROOT,
                check=False,
            )
        out, err = done.stdout.decode(), done.stderr.decode()
        assert done.returncode == 0, f"accord {' '.join(args)}: {done.returncode}\n{out}\n{err}"
        return out

    def start(self, name: str, *args: str) -> None:
        """Start a long-running `accord` command, its output in <tmp>/<name>.log."""
        log = (self.tmp / f"{name}.log").open("wb")
        self.logs.append(log)
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "accord", *args],
            env=self.env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def log_tails(self) -> str:
        parts = []
        for name in self.procs:
            text = (self.tmp / f"{name}.log").read_text(errors="replace")
            parts.append(f"--- {name} ---\n" + "\n".join(text.splitlines()[-25:]))
        return "\n".join(parts)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                pytest.fail(f"accord {name} exited with {proc.returncode}\n{self.log_tails()}")

    async def wait_until(
        self, what: str, check: Callable[[], Awaitable[bool]], timeout_s: float = SETTLE_TIMEOUT_S
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while not await check():
            self.check_alive()
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting until {what}\n{await self.dump()}")
            await anyio.sleep(0.25)

    async def dump(self) -> str:
        jobs = await self.conn.fetch("SELECT job_id, state FROM jobs.jobs ORDER BY job_id")
        effects = await self.conn.fetch(
            "SELECT job_id, effect_key, state, receipt FROM jobs.effects ORDER BY job_id, seq"
        )
        return (
            f"jobs: {[tuple(r) for r in jobs]}\neffects: {[tuple(r) for r in effects]}\n"
            f"mailer: {self.mailer.stats()} archive: {self.archive.stats()}\n{self.log_tails()}"
        )

    async def job_states(self) -> dict[int, str]:
        rows = await self.conn.fetch("SELECT job_id, state FROM jobs.jobs")
        return {r["job_id"]: r["state"] for r in rows}

    async def effects(self) -> list[asyncpg.Record]:
        return list(
            await self.conn.fetch(
                "SELECT job_id, effect_key, state, receipt FROM jobs.effects ORDER BY job_id, seq"
            )
        )

    async def unknown_effects(self) -> dict[str, int]:
        """effect key → job id of the effects recorded unknown."""
        found: dict[str, int] = {}
        for e in await self.effects():
            if e["state"] == "unknown":
                assert e["effect_key"] not in found, f"two unknown {e['effect_key']} effects"
                found[e["effect_key"]] = e["job_id"]
        return found


async def _drop_broker_names(prefix: str) -> None:
    exchanges, queues = app.topology(prefix).names()
    conn = await aio_pika.connect(AMQP_URL)
    try:
        for queue in queues:
            channel = await conn.channel()
            await channel.queue_delete(queue)
            await channel.close()
        for exchange in exchanges:
            channel = await conn.channel()
            await channel.exchange_delete(exchange)
            await channel.close()
    finally:
        await conn.close()


def _wait_or_kill(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    try:
        proc.wait(timeout=max(timeout_s, 0.1))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _stop(procs: dict[str, subprocess.Popen[bytes]], grace_s: float = 15.0) -> None:
    """SIGTERM every process still running, then SIGKILL what outlives the grace period."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs.values():
        await anyio.to_thread.run_sync(_wait_or_kill, proc, deadline - time.monotonic())


@asynccontextmanager
async def invoicing_stack(tmp_path: Path) -> AsyncIterator[Stack]:
    """A fresh database, both simulators, `accord migrate` + `register`, then the relay, both
    consumers and a worker. Everything is stopped and dropped on the way out."""
    hexid = uuid.uuid4().hex[:8]
    database, prefix = f"inv_{hexid}", f"inv{hexid}"
    dsn = f"postgresql://postgres@127.0.0.1:5432/{database}"
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'CREATE DATABASE "{database}"')
    finally:
        await admin.close()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs: list[IO[bytes]] = []
    try:
        async with AsyncExitStack() as stack:
            mailer = await stack.enter_async_context(
                ServiceSimulator(tmp_path / "mailer.sqlite", name="mailer", resource="messages")
            )
            archive = await stack.enter_async_context(
                ServiceSimulator(tmp_path / "archive.sqlite", name="archive", resource="documents")
            )
            env = {k: v for k, v in os.environ.items() if not k.startswith("INVOICING_")}
            env |= {
                "ACCORD_APP": "examples.invoicing.app:app",
                "ACCORD_PG_DSN": dsn,
                "ACCORD_AMQP_URL": AMQP_URL,
                "ACCORD_TOPOLOGY_PREFIX": prefix,
                "ACCORD_CONSUMER_TENANTS": "*",
                "ACCORD_JOURNAL_DIR": str(tmp_path / "journal"),
                "ACCORD_OBJECT_DIR": str(tmp_path / "objects"),
                "ACCORD_LEDGER_PATH": str(tmp_path / "authority.ledger"),
                "ACCORD_RELAY_POLL_S": "0.2",
                "INVOICING_MAILER_URL": mailer.url,
                "INVOICING_ARCHIVE_URL": archive.url,
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
                ),
            }
            conn = await asyncpg.connect(dsn)
            stack.push_async_callback(conn.close)
            running = Stack(tmp_path, dsn, env, mailer, archive, conn, procs, logs)
            migrated = await running.accord("migrate")
            assert "applied" in migrated, migrated
            registered = await running.accord(
                "register",
                "--workflow",
                "invoice_delivery",
                "--owner",
                "invoicing-worker",
                "--effects",
                "enabled",
            )
            assert "effects=enabled" in registered, registered
            running.start("relay", "relay")
            running.start("consume-delivery", "consume", "--workflow", "invoice_delivery")
            running.start("consume-ledger", "consume", "--workflow", "invoice_ledger")
            running.start(
                "worker",
                "worker",
                "--workflow",
                "invoice_delivery",
                "--lease-s",
                "3",
                "--poll-s",
                "0.2",
                "--rescue-every-s",
                "1",
            )
            try:
                yield running
            finally:
                await _stop(procs)
    finally:
        await _stop(procs)
        for log in logs:
            log.close()
        await _drop_broker_names(prefix)
        admin = await asyncpg.connect(ADMIN_DSN)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        finally:
            await admin.close()


async def issue_invoices(dsn: str, n: int) -> None:
    """N invoices, each in its own transaction; re-issuing one is idempotent."""
    conn = await asyncpg.connect(dsn)
    try:
        first = None
        for i in range(n):
            async with conn.transaction():
                event = await issue_invoice(
                    conn, TENANT, f"INV-{i:04d}", f"customer{i}@example.com", 1000 + 7 * i, "EUR"
                )
            first = first or event
        async with conn.transaction():
            again = await issue_invoice(
                conn, TENANT, "INV-0000", "customer0@example.com", 1000, "EUR"
            )
        assert first is not None and again.event_id == first.event_id
        assert again.operation_id == "invoice:INV-0000"
        invoices = await conn.fetchval(
            "SELECT count(*) FROM invoicing.invoices WHERE tenant = $1", TENANT
        )
        announced = await conn.fetchval(
            "SELECT count(*) FROM relay.outbox WHERE tenant = $1 AND type = 'invoice.issued'",
            TENANT,
        )
        assert invoices == n and announced == n  # the re-issue enqueued nothing
    finally:
        await conn.close()


async def drop_one_reply_each(stack: Stack) -> None:
    """The mailer's fault through its Python method, the archive's through PUT /admin/fault."""
    stack.mailer.set_fault(Fault.DROP_AFTER_ACCEPT, times=1)
    await ServiceClient(stack.archive.url, resource="documents").set_fault(
        "drop_after_accept", times=1
    )


async def settle_with_two_unknown(stack: Stack) -> dict[str, int]:
    """Wait until every job is succeeded or unknown; exactly the two affected jobs are unknown,
    one on each effect key. Returns effect key → job id of the unknown effects."""

    async def settled() -> bool:
        states = await stack.job_states()
        return len(states) == N and set(states.values()) <= {"succeeded", "unknown"}

    await stack.wait_until("every job is succeeded or unknown", settled)
    states = await stack.job_states()
    unknown = await stack.unknown_effects()
    assert set(unknown) == {"mail.send", "archive.store"}, await stack.dump()
    assert unknown["mail.send"] != unknown["archive.store"]
    assert sorted(j for j, s in states.items() if s == "unknown") == sorted(unknown.values())
    # the job whose mail reply was lost never reached the archive
    effects = await stack.effects()
    assert [e["effect_key"] for e in effects if e["job_id"] == unknown["mail.send"]] == [
        "mail.send"
    ]
    assert stack.mailer.stats()["dropped"] == 1 and stack.archive.stats()["dropped"] == 1
    return unknown


def summary(out: str) -> dict[str, int]:
    found = re.search(
        r"^reconcile: resolved=(\d+) resumed=(\d+) left=(\d+) escalated=(\d+)$", out, re.M
    )
    assert found, out
    return dict(
        zip(("resolved", "resumed", "left", "escalated"), map(int, found.groups()), strict=True)
    )


async def audit_rows(stack: Stack) -> list[asyncpg.Record]:
    return list(
        await stack.conn.fetch(
            "SELECT action, job_id, effect_key, evidence FROM jobs.repair_audit ORDER BY audit_id"
        )
    )


def receipt_ids(simulator: ServiceSimulator) -> set[str]:
    return {r.receipt_id for r in simulator.evidence()}


@pytest.mark.timeout(180)
async def test_lost_replies_are_reconciled_by_their_own_provider(tmp_path: Path) -> None:
    async with invoicing_stack(tmp_path) as stack:
        await drop_one_reply_each(stack)
        await issue_invoices(stack.dsn, N)
        unknown = await settle_with_two_unknown(stack)

        out = await stack.accord("reconcile", "--settle-s", "0")
        assert summary(out) == {"resolved": 2, "resumed": 2, "left": 0, "escalated": 0}, out
        for key, job_id in unknown.items():
            assert re.search(rf"^resolved job={job_id} key={key} .*outcome=succeeded", out, re.M)

        # each unknown effect was resolved from its own provider's receipt, and only from it
        effects = {(e["job_id"], e["effect_key"]): e for e in await stack.effects()}
        mail = effects[(unknown["mail.send"], "mail.send")]
        arch = effects[(unknown["archive.store"], "archive.store")]
        assert mail["state"] == "succeeded" and mail["receipt"] in receipt_ids(stack.mailer)
        assert arch["state"] == "succeeded" and arch["receipt"] in receipt_ids(stack.archive)
        resolutions = {
            (r["job_id"], r["effect_key"]): r["evidence"]
            for r in await audit_rows(stack)
            if r["effect_key"] is not None
        }
        assert set(resolutions) == {
            (unknown["mail.send"], "mail.send"),
            (unknown["archive.store"], "archive.store"),
        }
        mail_evidence = resolutions[(unknown["mail.send"], "mail.send")]
        arch_evidence = resolutions[(unknown["archive.store"], "archive.store")]
        assert "mailer" in mail_evidence and "archive" not in mail_evidence, mail_evidence
        assert mail["receipt"] in mail_evidence
        assert "archive" in arch_evidence and "mailer" not in arch_evidence, arch_evidence
        assert arch["receipt"] in arch_evidence

        # resumed, both jobs finish: every invoice sent, announced and in the ledger
        async def all_done() -> bool:
            states = await stack.job_states()
            ledger = await stack.conn.fetchval(
                "SELECT count(*) FROM invoicing_ledger.sent_invoices"
            )
            return set(states.values()) == {"succeeded"} and ledger == N

        await stack.wait_until("every job succeeded and the ledger has every invoice", all_done)
        sent = await stack.conn.fetch(
            "SELECT invoice_id, state, mail_receipt, archive_receipt FROM invoicing.invoices"
        )
        assert len(sent) == N and {r["state"] for r in sent} == {"sent"}
        ledger = await stack.conn.fetch(
            "SELECT invoice_id, mail_receipt, archive_receipt FROM invoicing_ledger.sent_invoices"
        )
        assert {tuple(r) for r in ledger} == {
            (r["invoice_id"], r["mail_receipt"], r["archive_receipt"]) for r in sent
        }

        # the providers' own evidence: one accepted request per invoice each, none repeated
        for simulator in (stack.mailer, stack.archive):
            stats = simulator.stats()
            assert len(simulator.evidence()) == N, (simulator.name, stats)
            assert stats["accepted"] == N and stats["replayed"] == 0, (simulator.name, stats)
            assert stats["conflicts"] == 0 and stats["refused"] == 0, (simulator.name, stats)
        assert {r["mail_receipt"] for r in sent} == receipt_ids(stack.mailer)
        assert {r["archive_receipt"] for r in sent} == receipt_ids(stack.archive)

        # the ledger is a projection: rebuilt from the events alone (as accord_projection),
        # it is the same, row for row
        ledger_sql = "SELECT * FROM invoicing_ledger.sent_invoices ORDER BY tenant, invoice_id"
        before = [tuple(r) for r in await stack.conn.fetch(ledger_sql)]
        await stack.accord("replay", "--workflow", "invoice_ledger", "--since", "1h", "--rebuild")
        assert [tuple(r) for r in await stack.conn.fetch(ledger_sql)] == before


@pytest.mark.timeout(180)
async def test_an_archive_without_lookup_is_escalated_not_resolved(tmp_path: Path) -> None:
    async with invoicing_stack(tmp_path) as stack:
        await drop_one_reply_each(stack)
        await issue_invoices(stack.dsn, N)
        unknown = await settle_with_two_unknown(stack)
        mail_job, archive_job = unknown["mail.send"], unknown["archive.store"]

        out = await stack.accord(
            "reconcile",
            "--settle-s",
            "0",
            "--escalate-after-s",
            "0",
            INVOICING_ARCHIVE_LOOKUP="false",
        )
        counts = summary(out)
        assert counts["left"] >= 1 and counts["resolved"] == 1 and counts["escalated"] >= 1, out
        assert re.search(rf"^resolved job={mail_job} key=mail\.send .*outcome=succeeded", out, re.M)
        assert re.search(
            rf"^left job={archive_job} key=archive\.store .*why=no_lookup$", out, re.M
        ), out
        assert re.search(rf"^escalated job={archive_job} key=archive\.store ", out, re.M), out
        assert not re.search(rf"^escalated job={mail_job} ", out, re.M), out

        # the archive's effect stays unknown, and nothing resolved it
        effects = {(e["job_id"], e["effect_key"]): e["state"] for e in await stack.effects()}
        assert effects[(archive_job, "archive.store")] == "unknown"
        audited = await audit_rows(stack)
        assert not [r for r in audited if r["effect_key"] == "archive.store"], audited
        mail_audit = [r["evidence"] for r in audited if r["effect_key"] == "mail.send"]
        assert len(mail_audit) == 1 and "mailer" in mail_audit[0], mail_audit

        # the mailer's job is resumed and finishes; the archive's stays unknown
        async def mail_job_done() -> bool:
            states = await stack.job_states()
            ledger = await stack.conn.fetchval(
                "SELECT count(*) FROM invoicing_ledger.sent_invoices"
            )
            return states[mail_job] == "succeeded" and ledger == N - 1

        await stack.wait_until("the reconciled mail job succeeded", mail_job_done)
        states = await stack.job_states()
        assert [j for j, s in states.items() if s != "succeeded"] == [archive_job]
        assert states[archive_job] == "unknown"
        effects = {(e["job_id"], e["effect_key"]): e["state"] for e in await stack.effects()}
        assert effects[(archive_job, "archive.store")] == "unknown"
        # although the archive holds the evidence that nobody asked it for
        assert len(stack.archive.evidence()) == N and len(stack.mailer.evidence()) == N
        assert stack.archive.stats()["replayed"] == 0 and stack.mailer.stats()["replayed"] == 0

        # a person resolves it from the archive's own evidence: the one receipt no effect has
        recorded = {
            e["receipt"] for e in await stack.effects() if e["effect_key"] == "archive.store"
        }
        (lost,) = receipt_ids(stack.archive) - recorded
        evidence = f"archive evidence: receipt {lost}"
        who = ("--who", "invoicing-test", "--evidence", evidence)
        await stack.accord(
            "repair", "resolve-effect", "--job", str(archive_job), "--key", "archive.store",
            "--outcome", "succeeded", "--receipt", lost, *who,
        )  # fmt: skip
        if (await stack.job_states())[archive_job] == "unknown":
            await stack.accord("repair", "resume", "--job", str(archive_job), *who)

        async def all_done() -> bool:
            states = await stack.job_states()
            ledger = await stack.conn.fetchval(
                "SELECT count(*) FROM invoicing_ledger.sent_invoices"
            )
            return set(states.values()) == {"succeeded"} and ledger == N

        await stack.wait_until("the resolved archive job succeeded", all_done)
        archived = await stack.conn.fetchval(
            "SELECT archive_receipt FROM invoicing.invoices i JOIN jobs.jobs j"
            " ON j.operation_id = i.operation_id WHERE j.job_id = $1",
            archive_job,
        )
        assert archived == lost
        assert len(stack.archive.evidence()) == N and stack.archive.stats()["replayed"] == 0


@pytest.mark.timeout(60)
async def test_the_simulator_honours_idempotency_keys_and_faults(tmp_path: Path) -> None:
    async with ServiceSimulator(tmp_path / "s.sqlite", name="archive", resource="documents") as s:
        client = ServiceClient(s.url, resource="documents")
        first = await client.send("k1", {"a": 1})
        assert await client.send("k1", {"a": 1}) == first
        with pytest.raises(MailConflict):
            await client.send("k1", {"a": 2})
        found = await client.lookup("k1")
        assert found is not None and found.receipt_id == first and found.service == "archive"
        assert await client.lookup("never") is None
        await client.set_fault(Fault.DROP_AFTER_ACCEPT, times=1)
        with pytest.raises(MailAmbiguous):
            await client.send("k2", {"b": 1})
        dropped = await client.lookup("k2")
        assert dropped is not None  # accepted before the reply was lost
        assert await client.send("k2", {"b": 1}) == dropped.receipt_id  # fault used up
        s.set_fault(Fault.FAIL_BEFORE_ACCEPT, times=1)
        with pytest.raises(MailRefused):
            await client.send("k3", {"c": 1})
        assert await client.lookup("k3") is None
        stats: dict[str, Any] = await client.stats()
        assert stats == {"accepted": 2, "replayed": 2, "refused": 1, "dropped": 1, "conflicts": 1}
        assert [r.idempotency_key for r in await client.evidence()] == ["k1", "k2"]
    with pytest.raises(MailRefused):  # nothing listens: nothing was sent
        await client.send("k4", {"d": 1})
