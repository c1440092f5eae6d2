"""The relay's retry backoff stays bounded however many times one row failed."""

from __future__ import annotations

import pytest

from accord.relay import Relay, RelayConfig
from accord.relay.errors import Nacked
from accord.relay.outbox import OutboxRow, OutboxState
from accord.relay.relay import AWAKE_POLL_S
from accord.schemas.errors import ConfigError
from accord.schemas.events import Event


def row(attempts: int) -> OutboxRow:
    event = Event(tenant="t", operation_id="op", type="a.b", version=1, payload={})
    return OutboxRow(id=1, event=event, digest="d" * 64, body=b"{}", trace={}, attempts=attempts)


def test_backoff_doubles_then_caps_and_never_overflows() -> None:
    config = RelayConfig(pg_dsn="postgresql://x/y", amqp_url="amqp://x/", exchange="e")
    relay = Relay(config)
    delays = [relay._failed(row(n), Nacked()).delay_s for n in (1, 2, 3, 1_025, 10**6)]
    assert delays[0] == config.retry_base_s  # control: the first retry waits the base delay
    assert delays[1] == 2 * config.retry_base_s
    assert delays[2] == 4 * config.retry_base_s
    # 2 ** 1024 would overflow a float: the capped exponent keeps the cap reachable
    assert delays[3] == delays[4] == config.retry_max_s
    settled = relay._failed(row(10**6), Nacked())
    assert settled.state == OutboxState.PENDING and settled.id == 1


@pytest.mark.parametrize("value", [-0.001, float("nan"), 30.0])
def test_a_relay_linger_is_a_non_negative_wait_shorter_than_its_lease(value: float) -> None:
    base = {"pg_dsn": "postgresql://x/y", "amqp_url": "amqp://x/", "exchange": "e"}
    assert RelayConfig(**base).linger_s == 0.01
    assert RelayConfig(**base, linger_s=0).linger_s == 0
    with pytest.raises(ConfigError):
        RelayConfig(**base, linger_s=value)


@pytest.mark.parametrize("value", [-0.5, float("nan"), 61.0, float("inf")])
def test_an_awake_promise_is_off_or_at_most_a_minute(value: float) -> None:
    """While a promise runs, enqueues do not NOTIFY: an unkept one leaves their events to
    the other relays' polls for that long, so it stays short and finite."""
    base = {"pg_dsn": "postgresql://x/y", "amqp_url": "amqp://x/", "exchange": "e"}
    assert RelayConfig(**base).awake_s == 2.0
    assert RelayConfig(**base, awake_s=0).awake_s == 0
    assert RelayConfig(**base, awake_s=60).awake_s == 60
    with pytest.raises(ConfigError):
        RelayConfig(**base, awake_s=value)


def test_an_awake_relay_polls_every_linger_and_never_less_often_than_idle() -> None:
    base = {"pg_dsn": "postgresql://x/y", "amqp_url": "amqp://x/", "exchange": "e"}
    assert Relay(RelayConfig(**base))._awake_poll_s == 0.01  # the linger
    assert Relay(RelayConfig(**base, linger_s=0))._awake_poll_s == AWAKE_POLL_S
    slow = RelayConfig(**base, linger_s=5.0, poll_s=1.0)
    assert Relay(slow)._awake_poll_s == 1.0  # a linger longer than the poll: the poll
