"""The async provider client: one HTTP/1.1 exchange per call over anyio, typed outcomes.

It knows exactly whether a request left: a failure to connect is a refusal (nothing was
sent), any failure after the first byte was written is ambiguous (see accord.demo.provider.errors).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import anyio
import anyio.abc

from accord.demo.provider.errors import (
    ProviderAmbiguous,
    ProviderConflict,
    ProviderLookupFailed,
    ProviderRefused,
)
from accord.demo.provider.wire import MAX_BODY, Fault, Receipt


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    body: Any


class _NoAnswer(Exception):
    """No HTTP answer; ``sent`` says whether any request byte may have reached the provider."""

    def __init__(self, sent: bool, detail: str) -> None:
        super().__init__(detail)
        self.sent = sent


class ProviderClient:
    """Async client for the provider (plain HTTP/1.1 over anyio, one connection per call).

    It knows exactly whether a request left: a failure to connect is a refusal (nothing was
    sent), while any failure after the first byte was written is ambiguous.
    """

    def __init__(
        self, base_url: str, *, timeout_s: float = 10.0, connect_timeout_s: float = 5.0
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"expected http://host:port, got {base_url!r}")
        self._host, self._port = parts.hostname, parts.port
        self._timeout_s, self._connect_timeout_s = timeout_s, connect_timeout_s

    async def create_report(
        self,
        idempotency_key: str,
        body: Mapping[str, Any],
        *,
        fault: Fault | None = None,
        delay_s: float = 0.0,
    ) -> Receipt:
        """Ask the provider to create a report once per key; returns its receipt.

        Raises ProviderRefused (nothing happened: retry is safe), ProviderAmbiguous (sent,
        outcome unknown: look the key up), ProviderConflict (key reused with another body).
        """
        headers = {"Idempotency-Key": idempotency_key, "Content-Type": "application/json"}
        if fault is not None:
            headers |= {"X-Accord-Fault": fault.value, "X-Accord-Fault-Delay": str(delay_s)}
        payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        try:
            answer = await self._call("POST", "/reports", headers, payload)
        except _NoAnswer as exc:
            if exc.sent:
                raise ProviderAmbiguous(key=idempotency_key, detail=str(exc)) from exc
            raise ProviderRefused(key=idempotency_key, detail=str(exc)) from exc
        if answer.status in (200, 201) and isinstance(answer.body, dict):
            return Receipt.from_json(answer.body)
        if answer.status == 409:
            raise ProviderConflict(key=idempotency_key)
        said_not_accepted = isinstance(answer.body, dict) and answer.body.get("accepted") is False
        if said_not_accepted or 400 <= answer.status < 500:
            raise ProviderRefused(key=idempotency_key, status=answer.status)
        raise ProviderAmbiguous(key=idempotency_key, status=answer.status)

    async def lookup(self, idempotency_key: str) -> Receipt | None:
        """The receipt the provider holds for the key, or None if it never accepted it."""
        try:
            answer = await self._call("GET", f"/reports/{quote(idempotency_key, safe='')}")
        except _NoAnswer as exc:
            raise ProviderLookupFailed(key=idempotency_key, detail=str(exc)) from exc
        if answer.status == 404:
            return None
        if answer.status == 200 and isinstance(answer.body, dict):
            return Receipt.from_json(answer.body)
        raise ProviderLookupFailed(key=idempotency_key, status=answer.status)

    async def evidence(self) -> list[Receipt]:
        """Every receipt the provider holds, in acceptance order."""
        answer = await self._call("GET", "/evidence")
        return [Receipt.from_json(item) for item in answer.body]

    async def stats(self) -> dict[str, int]:
        """Counts since the provider started: accepted, replayed, refused, dropped."""
        return dict((await self._call("GET", "/stats")).body)

    async def set_fault(
        self, mode: Fault, *, delay_s: float = 0.0, times: int | None = None
    ) -> None:
        """Set the provider's global fault (for a provider running as another process)."""
        spec = json.dumps({"mode": mode.value, "delay_s": delay_s, "times": times}).encode()
        await self._call("PUT", "/admin/fault", {"Content-Type": "application/json"}, spec)

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
        return _parse_answer(raw)


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


def _parse_answer(raw: bytes) -> _Answer:
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
