"""An application's declarations are refused when they are made (or when the process that
reads them starts), not at run time as poison: each case beside what is accepted.

Before, each of these was accepted and failed later: a ``material`` name its model lacks
dropped out of the digest (a changed meaning read as a duplicate); a handler version ``"1"``
bound the queue and matched no delivery; two providers owning one key let whichever lookup
came first judge its effect; job and consumer numbers the database refuses poisoned every
message that started a job; a tenant no event can carry refused every delivery as another
tenant's; ``inf``/``nan`` durations passed every bound."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from accord import App, Catalog, Event, EventType, JobContext, Tx
from accord.commands import args, consume
from accord.errors import AppInvalid
from accord.schemas.errors import ConfigError, PayloadTooLarge
from accord.schemas.settings import Settings


class Placed(BaseModel):
    order_id: str
    amount: int
    note: str = Field(default="", alias="comment")


def catalog() -> Catalog:
    return Catalog([EventType("order.placed", 1, Placed, material=("order_id", "amount"))])


async def _ignore(tx: Tx, event: Event) -> None:
    return None


async def _job(ctx: JobContext) -> None:
    return None


@pytest.mark.parametrize("material", [("order_idd", "amount"), (), ("amout",)])
def test_material_must_name_fields_of_the_model(material: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="material must name fields of Placed"):
        Catalog([EventType("order.placed", 1, Placed, material=material)])
    Catalog([EventType("order.placed", 1, Placed, material=("order_id", "comment"))])  # alias


class ByEitherName(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    order_id: str
    note: str = Field(default="", alias="comment")


class ByChoices(BaseModel):
    order_id: str
    note: str = Field(default="", validation_alias=AliasChoices("comment", "remark"))


@pytest.mark.parametrize(
    ("model", "material", "says"),
    [
        (Placed, ("order_id", "note"), "payloads carry it as 'comment'"),
        (ByEitherName, ("order_id", "comment"), "'comment' or 'note'"),
        (ByEitherName, ("order_id", "note"), "'comment' or 'note'"),
        (ByChoices, ("order_id", "note"), "no one key"),
    ],
)
def test_material_names_the_one_key_payloads_carry_a_field_under(
    model: type[BaseModel], material: tuple[str, ...], says: str
) -> None:
    """The digest reads the payload by the material's names: a field name whose payloads
    carry an alias dropped out of it, and two payloads differing only there had one digest
    (a changed meaning read as a duplicate). Refused at registration, naming the key to use;
    control: named by its alias, the field is in the digest."""
    with pytest.raises(ValueError, match=says):
        Catalog([EventType("order.placed", 1, model, material=material)])
    named = Catalog([EventType("order.placed", 1, Placed, material=("order_id", "comment"))])

    def digest(comment: str) -> str:
        payload = {"order_id": "o1", "amount": 5, "comment": comment}
        event = Event(tenant="t", operation_id="op", type="order.placed", version=1,
                      payload=payload)  # fmt: skip
        return named.digest(event)

    assert digest("ship today") != digest("CANCEL")


@pytest.mark.parametrize(("type_", "version"), [("order.placed", "1"), ("order.placed", 0),
                                                ("order.placed", 1000), ("Order", 1)])  # fmt: skip
def test_a_handler_takes_only_a_type_and_version_an_event_can_carry(
    type_: Any, version: Any
) -> None:
    app = App("shop", catalog=catalog())
    with pytest.raises(ValueError):
        app.consumer("orders").on(type_, version)(_ignore)
    app.consumer("audit").on("order.placed", 1)(_ignore)  # control


@pytest.mark.parametrize(
    "owns", [(("mail.",), ("mail.bulk.",)), (("mail.",), ("mail.send",)), (("x",), ("x",))]
)
def test_two_providers_may_not_own_one_key(owns: tuple[tuple[str, ...], ...]) -> None:
    app = App("shop", catalog=catalog())
    app.provider("generic", owns=owns[0])
    app.provider("bulk", owns=owns[1])
    with pytest.raises(AppInvalid, match="two providers own overlapping effect keys"):
        app.validate()
    control = App("shop", catalog=catalog())
    control.provider("mail", owns=("mail.",))
    control.provider("sms", owns=("sms.", "mailbox"))
    control.validate()


@pytest.mark.parametrize(
    "options",
    [{"timeout_s": -1}, {"timeout_s": float("nan")}, {"max_attempts": 0},
     {"lease_s": 0}, {"lease_s": float("inf")}, {"max_attempts": 2.5}],
)  # fmt: skip
def test_a_job_class_needs_numbers_a_job_can_run_with(options: dict[str, Any]) -> None:
    app = App("shop", catalog=catalog())
    with pytest.raises(AppInvalid) as refused:
        app.job("orders", owner="w", **options)(_job)
    assert refused.value.fields["wrong"] == list(options)
    app.job("orders", owner="w", timeout_s=5, max_attempts=1, lease_s=30)(_job)  # control


def test_a_consumer_needs_a_delivery_limit_and_tenants_an_event_can_carry() -> None:
    app = App("shop", catalog=catalog())
    with pytest.raises(AppInvalid):
        app.consumer("orders", delivery_limit=0)
    for tenants in (("acme,beta",), ("acme beta",)):
        with pytest.raises(AppInvalid):
            app.consumer("orders", tenants=tenants)
    app.consumer("orders", tenants=("acme", "beta-2"), delivery_limit=1)  # control
    app.projection("totals", reset=("DELETE FROM t",), tenants=("*",))


def _consume_args(*tenants: str) -> argparse.Namespace:
    return argparse.Namespace(workflow="orders", tenant=list(tenants))


def test_accord_consume_refuses_tenants_no_event_carries_and_a_body_limit_below_the_app(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = App("shop", catalog=catalog())
    app.consumer("orders").on("order.placed", 1)(_ignore)
    settings = Settings()
    with pytest.raises(ConfigError, match="one tenant per --tenant"):
        consume.config_from(_consume_args("acme,beta"), settings, app)
    monkeypatch.setenv("ACCORD_CONSUMER_TENANTS", "acme beta")
    with pytest.raises(ConfigError):
        consume.config_from(_consume_args(), Settings(), app)
    monkeypatch.setenv("ACCORD_CONSUMER_TENANTS", "acme, beta")
    assert consume.config_from(_consume_args(), Settings(), app).tenants == {"acme", "beta"}
    big = App("shop", catalog=catalog(), max_payload_bytes=settings.consumer_max_body_bytes + 1)
    big.consumer("orders").on("order.placed", 1)(_ignore)
    with pytest.raises(ConfigError, match="ACCORD_CONSUMER_MAX_BODY_BYTES"):
        consume.config_from(_consume_args("acme"), settings, big)


def test_the_application_s_payload_limit_is_the_one_its_enqueue_holds_to() -> None:
    event = Event(
        tenant="acme", operation_id="o-1", type="order.placed", version=1,
        payload={"order_id": "A", "amount": 1, "comment": "x" * 200},
    )  # fmt: skip
    App("shop", catalog=catalog()).prepare(event)  # control: the default limit
    with pytest.raises(PayloadTooLarge):
        App("shop", catalog=catalog(), max_payload_bytes=100).prepare(event)
    with pytest.raises(AppInvalid):
        App("shop", catalog=catalog(), max_payload_bytes=0)
    with pytest.raises(AppInvalid):  # past what a consumer's body limit may be
        App("shop", catalog=catalog(), max_payload_bytes=512 * 1024 * 1024 + 1)


@pytest.mark.parametrize("text", ["nan", "inf", "-1", "1e300", "x", ""])
def test_durations_from_the_command_line_are_finite(text: str) -> None:
    for parse in (args.seconds(), args.seconds(positive=True)):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)
    assert args.seconds()("0") == 0.0 and args.seconds(positive=True)("2.5") == 2.5  # control
    with pytest.raises(argparse.ArgumentTypeError):
        args.seconds(positive=True)("0")


@pytest.mark.parametrize("text", ["0", "-1", "1.5", "x", "", str(2**63)])
def test_counts_and_ids_from_the_command_line_are_in_range(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        args.job_id(text)
    assert args.job_id(str(2**63 - 1)) == 2**63 - 1 and args.count()("1") == 1  # control
    assert args.port("0") == 0 and args.port("65535") == 65535
    with pytest.raises(argparse.ArgumentTypeError):
        args.port("65536")


@pytest.mark.parametrize("text", ["", "  ", "a\x00b", "acme\udcff", "\ud800"])
def test_text_from_the_command_line_is_text_postgresql_holds(text: str) -> None:
    """No NUL (a programmatic ``main([...])`` can pass one), no byte the locale did not
    decode (a lone surrogate): refused as a usage error, not met by asyncpg after the start
    (control: accents and other scripts are text)."""
    with pytest.raises(argparse.ArgumentTypeError):
        args.text(text)
    assert args.text("Zoë 東京") == "Zoë 東京"


@pytest.mark.parametrize(
    "declare",
    [
        lambda app: app.consumer("billing", tenants="acme"),
        lambda app: app.projection("ledger", reset="DELETE FROM ledger"),
        lambda app: app.job("ship", owner="w", effects="mail.")(_job),
        lambda app: app.provider("mailer", owns="mail."),
    ],
    ids=["tenants", "reset", "effects", "owns"],
)
def test_one_string_where_names_are_declared_is_refused(declare: Any) -> None:
    """``tuple("acme")`` is a, c, m, e: a consumer declared with ``tenants="acme"`` served
    four one-letter tenants and poisoned acme's events as another tenant's. Refused when
    declared (control: the same as a tuple)."""
    with pytest.raises(AppInvalid, match="not one string"):
        declare(App("shop", catalog=catalog()))
    App("shop", catalog=catalog()).consumer("billing", tenants=("acme",))  # control


def test_a_consumer_class_that_handles_nothing_is_refused_by_accord_consume() -> None:
    """Its queue would be declared bound to no event type, and its process ready and idle
    (its handlers' module not imported): `accord consume` refuses it. The application still
    loads (a class retired by removing its handlers keeps `accord dead-letters`); control:
    with one handler it is configured."""
    app = App("shop", catalog=catalog())
    app.consumer("orders")
    app.validate()
    args = argparse.Namespace(workflow="orders", tenant=["acme"])
    with pytest.raises(ConfigError, match="handles no event type"):
        consume.config_from(args, Settings(), app)
    app.consumers["orders"].handlers.on("order.placed", 1)(_ignore)
    assert consume.config_from(args, Settings(), app).workflow == "orders"
