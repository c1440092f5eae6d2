"""A TCP proxy of the test's own in front of a shared service, which the test can cut
(connections closed, new ones refused at once) and restore; the service itself is never
touched."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from urllib.parse import urlsplit, urlunsplit


class Proxy:
    """127.0.0.1:<ephemeral> → 127.0.0.1:``target``, one thread per direction."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._up = True
        self._stalled = threading.Event()  # set: bytes are held, connections stay open
        self._stall_on: bytes | None = None  # a connection that sends these bytes is held
        self._restores = 0  # restore() calls so far: a held connection waits for the next
        self._holding = 0  # pipes holding a chunk now
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept)

    @classmethod
    def of(cls, url: str) -> Proxy:
        """A proxy in front of the server a DSN or an AMQP URL names (on this host)."""
        parts = urlsplit(url)
        return cls(parts.port or (5672 if parts.scheme.startswith("amqp") else 5432))

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._up:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open += [client, upstream]
            self._spawn(self._pipe, client, upstream)
            self._spawn(self._pipe, upstream, client)

    def url(self, url: str) -> str:
        """``url`` (a DSN or an AMQP URL) through this proxy: its host and port replaced,
        its user and password kept."""
        parts = urlsplit(url)
        user = parts.netloc.rpartition("@")[0]
        return urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{self.port}" if user
                                         else f"127.0.0.1:{self.port}"))  # fmt: skip

    def holding(self) -> bool:
        """Whether bytes are being held now (stalled, and a client has sent some)."""
        return self._holding > 0

    def wait_holding(self, within: float = 30) -> None:
        """Wait until bytes are held (``stall`` or ``stall_on``); AssertionError after
        ``within`` seconds."""
        deadline = time.monotonic() + within
        while not self.holding() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.holding(), f"no client reached the held bytes within {within}s"

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            held_until = -1  # this pipe met the marker: held until the next restore()
            while chunk := source.recv(65536):
                # The count before the marker: a restore() between the two reads then
                # releases this chunk, never one that never comes.
                restores, marker = self._restores, self._stall_on
                if marker is not None and marker in chunk:
                    held_until = restores + 1
                if self._stalled.is_set() or held_until > self._restores:
                    with self._lock:
                        self._holding += 1
                    while (
                        self._stalled.is_set() or held_until > self._restores
                    ) and not self._closed:
                        time.sleep(0.05)
                    with self._lock:
                        self._holding -= 1
                sink.sendall(chunk)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def _drop_all(self) -> None:
        with self._lock:
            sockets, self._open = self._open, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def cut(self) -> None:
        """The service is gone: open connections reset, new ones closed on arrival."""
        self._up = False
        self._drop_all()

    def stall(self) -> None:
        """The service stops answering: connections stay open, nothing gets through (what a
        hung server or a black-holed network looks like to a client)."""
        self._stalled.set()

    def stall_on(self, marker: bytes) -> None:
        """Hold each connection, from the first chunk that holds ``marker`` (either way, that
        chunk included), until ``restore``; the others pass: a test can stop one client at a
        chosen request (a role in its startup packet, a name it declares)."""
        self._stall_on = marker

    def restore(self, *, stall_on: bytes | None = None) -> None:
        """Let everything through again (held connections included); ``stall_on``: but hold
        each connection that sends it from now on (as ``stall_on``, with no gap between)."""
        self._stall_on = stall_on
        self._stalled.clear()
        with self._lock:
            self._restores += 1
        self._up = True

    def close(self) -> None:
        self._closed = True
        self._up = False
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._drop_all()
        for thread in self._threads:
            thread.join(timeout=5)
