"""The provider simulator's server: loopback HTTP with durable evidence and injected faults.

Invariant: a request is committed to the evidence file (SQLite, ``synchronous=FULL``) before
any answer is sent or the connection is dropped, and an idempotency key is accepted at most
once: the same key again returns the original receipt and records nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import sqlite3
import struct
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import anyio

from accord.demo.provider.wire import HOST, MAX_BODY, Fault, Receipt

log = logging.getLogger(__name__)

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
# Record one accepted request (the key is UNIQUE: accepted at most once).
_INSERT = """
INSERT INTO accepted (receipt_id, idempotency_key, body_sha256, accepted_at, body)
VALUES (?, ?, ?, ?, ?)
"""
# The receipt for an idempotency key.
_FIND = """
SELECT receipt_id, idempotency_key, body_sha256, accepted_at FROM accepted
WHERE idempotency_key = ?
"""
# Every receipt, in acceptance order.
_ALL = "SELECT receipt_id, idempotency_key, body_sha256, accepted_at FROM accepted ORDER BY seq"


class Evidence:
    """The provider's durable record of accepted requests (one SQLite file, fsynced commits)."""

    def __init__(self, path: str | Path) -> None:
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        # WAL with synchronous=FULL fsyncs the log on every commit: an answer implies durability.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(_SCHEMA)

    def accept(self, key: str, body: bytes) -> tuple[Receipt, bool] | None:
        """(receipt, new) for ``key``; None when the key was accepted with another body."""
        digest = hashlib.sha256(body).hexdigest()
        with self._lock:
            found = self._find(key)
            if found is not None:
                return (found, False) if found.body_sha256 == digest else None
            receipt = Receipt(f"rcpt-{uuid.uuid4().hex}", key, digest, time.time())
            self._db.execute(_INSERT, (receipt.receipt_id, key, digest, receipt.accepted_at, body))
            return receipt, True

    def find(self, key: str) -> Receipt | None:
        with self._lock:
            return self._find(key)

    def _find(self, key: str) -> Receipt | None:
        row = self._db.execute(_FIND, (key,)).fetchone()
        return None if row is None else Receipt(*row)

    def all(self) -> list[Receipt]:
        with self._lock:
            rows = self._db.execute(_ALL).fetchall()
        return [Receipt(*row) for row in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


@dataclass
class _State:
    evidence: Evidence
    stopping: threading.Event
    fault: Fault = Fault.NONE
    delay_s: float = 0.0
    times: int | None = None
    stats: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("accepted", "replayed", "refused", "dropped"), 0)
    )
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_fault(self, header: str | None, delay: str | None) -> tuple[Fault, float]:
        if header:
            return Fault(header), float(delay or 0)
        with self.lock:
            fault, delay_s = self.fault, self.delay_s
            if fault is not Fault.NONE and self.times is not None:
                self.times -= 1
                if self.times <= 0:
                    self.fault, self.times = Fault.NONE, None
            return fault, delay_s

    def count(self, name: str) -> None:
        with self.lock:
            self.stats[name] += 1


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 30  # an idle client cannot hold a handler thread (and shutdown) for ever

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("provider: " + format, *args)

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
        if self.path.startswith("/reports/"):
            receipt = state.evidence.find(unquote(self.path.removeprefix("/reports/")))
            if receipt is None:
                self._reply(404, {"error": "not_found"})
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
        spec = json.loads(body or b"{}")
        self.server.set_fault(
            Fault(spec.get("mode", "none")), spec.get("delay_s", 0.0), spec.get("times")
        )
        self._reply(200, {"mode": spec.get("mode", "none")})

    def do_POST(self) -> None:
        state = self.server.state
        key = self.headers.get("Idempotency-Key")
        body = self._body()
        if body is None:
            return
        if self.path != "/reports" or not key:
            self._reply(
                400, {"error": "need POST /reports with an Idempotency-Key", "accepted": False}
            )
            return
        try:
            fault, delay_s = state.take_fault(
                self.headers.get("X-Accord-Fault"), self.headers.get("X-Accord-Fault-Delay")
            )
        except ValueError:
            self._reply(400, {"error": "unknown fault", "accepted": False})
            return
        if fault is Fault.FAIL_BEFORE_ACCEPT:
            state.count("refused")
            self._reply(500, {"error": "not_accepted", "accepted": False})
            return
        outcome = state.evidence.accept(key, body)
        if outcome is None:
            self._reply(409, {"error": "idempotency_key_reused", "accepted": False})
            return
        receipt, new = outcome
        state.count("accepted" if new else "replayed")
        if fault is Fault.DROP_AFTER_ACCEPT:
            state.count("dropped")
            self._reset()
            return
        if fault is Fault.SLOW:
            state.stopping.wait(delay_s)
        self._reply(201 if new else 200, {**asdict(receipt), "replayed": not new})

    def _reset(self) -> None:
        # SO_LINGER 0: close with a TCP reset, as a crashed or cut-off provider would.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True  # nothing was written: the client gets no answer


class _Server(ThreadingHTTPServer):
    # Handler threads are joined on close (no daemon threads touching a closed database).
    daemon_threads = False
    block_on_close = True
    # Many workers may connect at once; the default backlog of 5 makes the rest wait for a
    # SYN retransmit (a second), which would look like a slow provider.
    request_queue_size = 128
    state: _State

    def set_fault(self, mode: Fault, delay_s: float = 0.0, times: int | None = None) -> None:
        with self.state.lock:
            self.state.fault, self.state.delay_s, self.state.times = mode, float(delay_s), times


class ProviderServer:
    """The simulator, serving from a background thread on 127.0.0.1 (``port=0``: any free one)."""

    def __init__(self, db_path: str | Path, *, port: int = 0) -> None:
        self.db_path = Path(db_path)
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the provider is not running")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        server = _Server((HOST, self._port), _Handler)
        server.state = _State(Evidence(self.db_path), threading.Event())
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="provider",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.state.stopping.set()  # wakes slow handlers so close can join them
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join()
        server.state.evidence.close()

    def set_fault(self, mode: Fault, *, delay_s: float = 0.0, times: int | None = None) -> None:
        """Inject ``mode`` into every request (or the next ``times``) without its own fault."""
        if self._server is None:
            raise RuntimeError("the provider is not running")
        self._server.set_fault(mode, delay_s, times)

    def evidence(self) -> list[Receipt]:
        if self._server is None:
            raise RuntimeError("the provider is not running")
        return self._server.state.evidence.all()

    def __enter__(self) -> ProviderServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> ProviderServer:
        await anyio.to_thread.run_sync(self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await anyio.to_thread.run_sync(self.stop)
