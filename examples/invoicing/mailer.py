"""A provider simulator and its async client: the mail service the invoicing job calls, and,
as a second instance of the same module, the archive service.

The simulator is a real HTTP server on loopback (127.0.0.1 only, an ephemeral port by
default; stdlib ``ThreadingHTTPServer`` in a background thread) with its own durable
evidence: every request it accepts is committed to a SQLite file (``synchronous=FULL``)
*before* it answers. It honours an ``Idempotency-Key`` header: the same key again returns the
original receipt and records nothing new; the same key with another body is 409. Routes,
below the instance's ``resource`` (``messages`` for the mailer, ``documents`` for the
archive)::

    POST /<resource>         header Idempotency-Key, JSON body → 201 receipt (200 replayed)
    GET  /<resource>/<key>   200 receipt, 404 never accepted
    GET  /evidence           every receipt, in acceptance order
    GET  /stats              counts: accepted, replayed, refused, dropped, conflicts
    PUT  /admin/fault        {"mode": "drop_after_accept", "times": 1}

Faults (:meth:`ServiceSimulator.set_fault` or ``PUT /admin/fault``, optionally for the next
``times`` requests only): ``drop_after_accept`` records the request, then closes the
connection unanswered (a lost reply: the outcome is unknown to the caller);
``fail_before_accept`` answers 500 ``{"accepted": false}`` and records nothing.

:class:`ServiceClient` is the async client (plain HTTP/1.1 over anyio, one connection per
call). Its errors say what the caller may conclude: :class:`MailRefused` (definitely nothing
accepted: safe to retry), :class:`MailAmbiguous` (sent, no definite answer: look the key up),
:class:`MailConflict` (the key was accepted with another body), :class:`MailLookupFailed`
(a lookup got no definite answer).

As its own process: ``python -m examples.invoicing.mailer --name archive --resource documents
--port 8082 --db var/archive.sqlite`` (serves until SIGTERM or SIGINT).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import signal
import socket
import sqlite3
import struct
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import anyio
import anyio.abc

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
MAX_BODY = 1 << 20


class Fault(StrEnum):
    NONE = "none"
    DROP_AFTER_ACCEPT = "drop_after_accept"
    FAIL_BEFORE_ACCEPT = "fail_before_accept"


@dataclass(frozen=True, slots=True)
class StoredReceipt:
    """The service's proof that it accepted one request (its evidence row)."""

    receipt_id: str
    service: str
    idempotency_key: str
    body_sha256: str
    accepted_at: float

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StoredReceipt:
        return cls(
            receipt_id=str(data["receipt_id"]),
            service=str(data["service"]),
            idempotency_key=str(data["idempotency_key"]),
            body_sha256=str(data["body_sha256"]),
            accepted_at=float(data["accepted_at"]),
        )


# -- errors -------------------------------------------------------------------------------


class MailError(Exception):
    """A call to the service did not return a receipt."""

    def __init__(self, message: str, *, key: str, status: int | None = None) -> None:
        super().__init__(f"{message} (key={key}, status={status})")
        self.key = key
        self.status = status


class MailRefused(MailError):
    """Definitely not accepted (nothing was sent, or the service said accepted=false)."""


class MailAmbiguous(MailError):
    """The request was sent, then no definite answer came back: the outcome is unknown."""


class MailConflict(MailError):
    """The idempotency key was already accepted with another body."""


class MailLookupFailed(MailError):
    """A receipt lookup got no definite answer."""


# -- the simulator ------------------------------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS accepted (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL UNIQUE,
    receipt_id      TEXT NOT NULL UNIQUE,
    body_sha256     TEXT NOT NULL,
    body            BLOB NOT NULL,
    accepted_at     REAL NOT NULL
)
"""
_INSERT = (
    "INSERT INTO accepted (idempotency_key, receipt_id, body_sha256, body, accepted_at)"
    " VALUES (?, ?, ?, ?, ?)"
)
_FIND = (
    "SELECT receipt_id, idempotency_key, body_sha256, accepted_at FROM accepted"
    " WHERE idempotency_key = ?"
)
_ALL = "SELECT receipt_id, idempotency_key, body_sha256, accepted_at FROM accepted ORDER BY seq"


class Evidence:
    """The durable record of accepted requests: one SQLite file, every commit fsynced."""

    def __init__(self, path: str | Path, service: str) -> None:
        self.service = service
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a commit is on disk before we answer
        self._db.execute(_SCHEMA)

    def accept(self, key: str, body: bytes) -> tuple[StoredReceipt, bool] | None:
        """(receipt, new) for ``key``; None when the key was accepted with another body."""
        digest = hashlib.sha256(body).hexdigest()
        with self._lock:
            found = self._find(key)
            if found is not None:
                return (found, False) if found.body_sha256 == digest else None
            receipt = StoredReceipt(
                f"{self.service}-{uuid.uuid4().hex[:16]}", self.service, key, digest, time.time()
            )
            self._db.execute(
                _INSERT, (key, receipt.receipt_id, digest, body, receipt.accepted_at)
            )  # autocommit: committed (and fsynced) here
            return receipt, True

    def find(self, key: str) -> StoredReceipt | None:
        with self._lock:
            return self._find(key)

    def _find(self, key: str) -> StoredReceipt | None:
        row = self._db.execute(_FIND, (key,)).fetchone()
        return None if row is None else StoredReceipt(row[0], self.service, *row[1:])

    def all(self) -> list[StoredReceipt]:
        with self._lock:
            rows = self._db.execute(_ALL).fetchall()
        return [StoredReceipt(r[0], self.service, *r[1:]) for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


@dataclass
class _State:
    evidence: Evidence
    resource: str
    fault: Fault = Fault.NONE
    times: int | None = None
    stats: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("accepted", "replayed", "refused", "dropped", "conflicts"), 0
        )
    )
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set_fault(self, mode: Fault, times: int | None) -> None:
        if times is not None and times <= 0:
            mode, times = Fault.NONE, None
        with self.lock:
            self.fault, self.times = mode, times

    def take_fault(self) -> Fault:
        """The fault for this request (a counted fault is used up by it)."""
        with self.lock:
            fault = self.fault
            if fault is not Fault.NONE and self.times is not None:
                self.times -= 1
                if self.times <= 0:
                    self.fault, self.times = Fault.NONE, None
            return fault

    def count(self, name: str) -> None:
        with self.lock:
            self.stats[name] += 1


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 30  # an idle client cannot hold a handler thread (and shutdown) for ever

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s: " + format, self.server.state.evidence.service, *args)

    def _reply(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> bytes | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._reply(413, {"error": "too_large", "accepted": False})
            return None
        return self.rfile.read(length)

    def do_GET(self) -> None:
        state = self.server.state
        prefix = f"/{state.resource}/"
        if self.path.startswith(prefix):
            receipt = state.evidence.find(unquote(self.path.removeprefix(prefix)))
            if receipt is None:
                self._reply(404, {"error": "never_accepted"})
            else:
                self._reply(200, asdict(receipt))
        elif self.path == "/evidence":
            self._reply(200, [asdict(r) for r in state.evidence.all()])
        elif self.path == "/stats":
            with state.lock:
                self._reply(200, dict(state.stats))
        else:
            self._reply(404, {"error": "no_route"})

    def do_PUT(self) -> None:
        body = self._body()
        if body is None:
            return
        if self.path != "/admin/fault":
            self._reply(404, {"error": "no_route"})
            return
        try:
            spec = json.loads(body or b"{}")
            mode = Fault(spec.get("mode", "none"))
            times = spec.get("times")
            if times is not None and not isinstance(times, int):
                raise ValueError("times is an integer")
        except (ValueError, AttributeError) as exc:
            self._reply(400, {"error": f"bad fault: {exc}"})
            return
        self.server.state.set_fault(mode, times)
        self._reply(200, {"mode": mode.value, "times": times})

    def do_POST(self) -> None:
        state = self.server.state
        key = self.headers.get("Idempotency-Key")
        body = self._body()
        if body is None:
            return
        if self.path != f"/{state.resource}" or not key:
            state.count("refused")
            self._reply(
                400,
                {
                    "error": f"need POST /{state.resource} with an Idempotency-Key",
                    "accepted": False,
                },
            )
            return
        fault = state.take_fault()
        if fault is Fault.FAIL_BEFORE_ACCEPT:
            state.count("refused")
            self._reply(500, {"error": "not_accepted", "accepted": False})
            return
        outcome = state.evidence.accept(key, body)  # committed before any answer
        if outcome is None:
            state.count("conflicts")
            self._reply(409, {"error": "idempotency_key_reused", "accepted": False})
            return
        receipt, new = outcome
        state.count("accepted" if new else "replayed")
        if fault is Fault.DROP_AFTER_ACCEPT:
            state.count("dropped")
            # SO_LINGER 0: the close is a TCP reset, as from a provider cut off mid-answer.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True  # nothing was written: the caller gets no answer
            return
        self._reply(201 if new else 200, {**asdict(receipt), "replayed": not new})


class _Server(ThreadingHTTPServer):
    # Handler threads are joined on close (none touches a closed evidence file).
    daemon_threads = False
    block_on_close = True
    request_queue_size = 128  # several workers connecting at once need no SYN retransmit
    state: _State


class ServiceSimulator:
    """One simulated service on 127.0.0.1 (``port=0``: an ephemeral one), serving from a
    background thread. ``name`` is the service named in its receipts (``mailer``,
    ``archive``); ``resource`` its path (``/messages``, ``/documents``)."""

    def __init__(
        self,
        db_path: str | Path,
        *,
        name: str = "mailer",
        resource: str = "messages",
        port: int = 0,
    ) -> None:
        if not resource or "/" in resource:
            raise ValueError(f"a resource is one path segment, got {resource!r}")
        self.db_path = Path(db_path)
        self.name = name
        self.resource = resource
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def _running(self) -> _Server:
        if self._server is None:
            raise RuntimeError(f"the {self.name} simulator is not running")
        return self._server

    @property
    def port(self) -> int:
        return int(self._running().server_address[1])

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        server = _Server((HOST, self._port), _Handler)
        server.state = _State(Evidence(self.db_path, self.name), self.resource)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"simulator-{self.name}",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()  # joins the handler threads
        if self._thread is not None:
            self._thread.join()
        server.state.evidence.close()

    def set_fault(self, mode: Fault | str, *, times: int | None = None) -> None:
        """Inject ``mode`` into every request from now on, or into the next ``times`` only."""
        self._running().state.set_fault(Fault(mode), times)

    def evidence(self) -> list[StoredReceipt]:
        """Every accepted request, in acceptance order (read from the evidence file)."""
        return self._running().state.evidence.all()

    def stats(self) -> dict[str, int]:
        state = self._running().state
        with state.lock:
            return dict(state.stats)

    def __enter__(self) -> ServiceSimulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> ServiceSimulator:
        await anyio.to_thread.run_sync(self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await anyio.to_thread.run_sync(self.stop)


# -- the client ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    body: Any


class _NoAnswer(Exception):
    """No HTTP answer; ``sent`` says whether any request byte may have reached the service."""

    def __init__(self, sent: bool, detail: str) -> None:
        super().__init__(detail)
        self.sent = sent


class ServiceClient:
    """Async client of one simulated service (one HTTP/1.1 connection per call).

    It knows whether a request left: a failed connect is a refusal (nothing was sent); a
    failure after the first byte was written is ambiguous.
    """

    def __init__(
        self,
        base_url: str,
        *,
        resource: str = "messages",
        timeout_s: float = 10.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"expected http://host:port, got {base_url!r}")
        self._host, self._port = parts.hostname, parts.port
        self._resource = resource
        self._timeout_s, self._connect_timeout_s = timeout_s, connect_timeout_s

    async def send(self, key: str, body: Mapping[str, Any]) -> str:
        """Ask the service to accept ``body`` once under ``key``; returns its receipt id.

        Raises MailRefused, MailAmbiguous or MailConflict (see the module docstring).
        """
        payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
        try:
            answer = await self._call("POST", f"/{self._resource}", headers, payload)
        except _NoAnswer as exc:
            error = MailAmbiguous if exc.sent else MailRefused
            raise error(str(exc), key=key) from exc
        if answer.status in (200, 201) and isinstance(answer.body, dict):
            return StoredReceipt.from_json(answer.body).receipt_id
        if answer.status == 409:
            raise MailConflict("the key was accepted with another body", key=key, status=409)
        not_accepted = isinstance(answer.body, dict) and answer.body.get("accepted") is False
        if not_accepted or 400 <= answer.status < 500:
            raise MailRefused("not accepted", key=key, status=answer.status)
        raise MailAmbiguous("no definite answer", key=key, status=answer.status)

    async def lookup(self, key: str) -> StoredReceipt | None:
        """The receipt the service holds for ``key``, or None if it never accepted it.
        MailLookupFailed when there is no definite answer."""
        try:
            answer = await self._call("GET", f"/{self._resource}/{quote(key, safe='')}")
        except _NoAnswer as exc:
            raise MailLookupFailed(str(exc), key=key) from exc
        if answer.status == 404:
            return None
        if answer.status == 200 and isinstance(answer.body, dict):
            return StoredReceipt.from_json(answer.body)
        raise MailLookupFailed("no definite answer", key=key, status=answer.status)

    async def stats(self) -> dict[str, int]:
        return dict((await self._call("GET", "/stats")).body)

    async def evidence(self) -> list[StoredReceipt]:
        return [
            StoredReceipt.from_json(item) for item in (await self._call("GET", "/evidence")).body
        ]

    async def set_fault(self, mode: Fault | str, *, times: int | None = None) -> None:
        """Set the service's fault (``PUT /admin/fault``)."""
        spec = json.dumps({"mode": Fault(mode).value, "times": times}).encode()
        answer = await self._call("PUT", "/admin/fault", {"Content-Type": "application/json"}, spec)
        if answer.status != 200:
            raise RuntimeError(f"setting the fault failed: {answer.status} {answer.body}")

    async def _call(
        self, method: str, path: str, headers: Mapping[str, str] | None = None, body: bytes = b""
    ) -> _Answer:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self._host}:{self._port}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
        request = "\r\n".join(lines).encode("latin-1") + body
        try:
            with anyio.fail_after(self._connect_timeout_s):
                stream = await anyio.connect_tcp(self._host, self._port)
        except (OSError, TimeoutError) as exc:
            raise _NoAnswer(False, f"connect: {exc!r}") from exc
        async with stream:
            try:
                with anyio.fail_after(self._timeout_s):
                    await stream.send(request)
                    raw = await _receive_all(stream)
            except (OSError, TimeoutError, anyio.BrokenResourceError) as exc:
                raise _NoAnswer(True, f"exchange: {exc!r}") from exc
        return _parse(raw)


async def _receive_all(stream: anyio.abc.ByteStream) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            chunk = await stream.receive()
        except anyio.EndOfStream:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_BODY + 65536:
            raise _NoAnswer(True, "answer too large")
        chunks.append(chunk)


def _parse(raw: bytes) -> _Answer:
    head, sep, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split(b" ")
    if not sep or len(status_line) < 2 or not status_line[1].isdigit():
        raise _NoAnswer(True, f"no HTTP answer ({len(raw)} bytes)")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and int(value) != len(body):
            raise _NoAnswer(True, "truncated answer")
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    return _Answer(int(status_line[1]), parsed)


def main(argv: list[str] | None = None) -> int:
    """Serve one simulated service until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="examples.invoicing.mailer", description=__doc__)
    parser.add_argument("--name", default="mailer", help="the service named in its receipts")
    parser.add_argument("--resource", default="messages", help="its path (/messages)")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any)")
    parser.add_argument("--db", required=True, help="the evidence file (SQLite)")
    args = parser.parse_args(argv)
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # before any thread: only sigwait gets them
    simulator = ServiceSimulator(args.db, name=args.name, resource=args.resource, port=args.port)
    simulator.start()
    print(
        f"{args.name} listening on {simulator.url}/{args.resource} evidence={args.db}", flush=True
    )
    try:
        signal.sigwait(stop)
    finally:
        simulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
