"""Connecting to RabbitMQ, with the broker's refusals mapped once, at the seam.

aio-pika reports a refused login as a ``ConnectionError`` (an ``OSError``), so every loop
that retries lost connections would retry it for ever; and a vhost the broker refuses comes
back as an ``InvalidFrameError`` (the broker answered Connection.Open with Connection.Close).
Both become a :class:`~accord.schemas.errors.ServiceRefused` that names where and what to do;
anything else is left as it is for the callers' transient handling.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import aio_pika
import aiormq

from accord.schemas.errors import (
    BrokerLoginRefused,
    BrokerVhostRefused,
    InvalidDsn,
    ServiceUnavailable,
)


def where(url: str) -> dict[str, str]:
    """Where an AMQP URL points: host:port, user and vhost (never the password)."""
    try:
        parts = urlsplit(url)
        port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    except ValueError:
        return {"url": "unparsable"}
    return {
        "at": f"{parts.hostname or 'localhost'}:{port}",
        "user": unquote(parts.username or "guest"),
        "vhost": unquote(parts.path[1:]) if len(parts.path) > 1 else "/",
    }


async def connect(url: str, **kwargs: Any) -> aio_pika.abc.AbstractConnection:
    """``aio_pika.connect`` with BrokerLoginRefused / BrokerVhostRefused for the refusals."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsed here: a port that is not a number is a ValueError
    except ValueError as exc:
        raise InvalidDsn(
            "the AMQP URL does not parse: fix ACCORD_AMQP_URL", detail=str(exc)
        ) from None
    if parts.scheme not in ("amqp", "amqps"):
        raise InvalidDsn("the AMQP URL must start with amqp:// or amqps://", url_scheme=url[:8])
    try:
        connection: aio_pika.abc.AbstractConnection = await aio_pika.connect(url, **kwargs)
        return connection
    except aiormq.exceptions.ProbableAuthenticationError as exc:
        raise BrokerLoginRefused(
            f"RabbitMQ refused the login ({exc.args[0] if exc.args else exc}):"
            " check the user and password in ACCORD_AMQP_URL",
            **where(url),
        ) from None
    except aiormq.exceptions.InvalidFrameError as exc:
        if "Connection.Close" not in str(exc) or "Connection.OpenOk" not in str(exc):
            raise
        raise BrokerVhostRefused(
            "RabbitMQ refused the vhost: create it (rabbitmqctl add_vhost) and give the user"
            " permissions (rabbitmqctl set_permissions), or fix ACCORD_AMQP_URL",
            **where(url),
        ) from None


async def connect_or_unavailable(url: str, **kwargs: Any) -> aio_pika.abc.AbstractConnection:
    """``connect``, with a broker that does not answer (refused, unreachable, a failed
    handshake) as ServiceUnavailable: one line for a command, not a traceback."""
    try:
        return await connect(url, **kwargs)
    except (aiormq.exceptions.AMQPError, OSError) as exc:
        raise ServiceUnavailable(service="rabbitmq", detail=type(exc).__name__) from exc
