"""The application object: the one place an application declares what accord runs for it.

An application builds one :class:`App` at import time and every `accord` command takes it
with ``--app module:attribute`` (or ``ACCORD_APP``)::

    app = App("invoicing", catalog=CATALOG, migrations=Path(__file__).parent / "migrations")

    delivery = app.consumer("invoice_delivery")          # a workflow class: its queue, its handlers

    @delivery.on("invoice.issued", 1)
    async def start_delivery(tx: Tx, event: Event) -> None:
        await app.submit(tx, event, workflow="invoice_delivery")   # idempotent on the operation

    mailer = app.provider("mailer", owns=("mail.",), lookup=lookup_receipt)

    @app.job("invoice_delivery", owner="invoicing-worker", effects=("mail.send",))
    async def deliver(ctx: JobContext) -> None: ...

What it declares: the event catalog; the consumer workflow classes (handlers by type and
version, the tenants served); projections (consumer classes whose handlers only write
projection tables, so ``accord replay`` can rebuild them); job handlers per class (timeout,
attempts, lease, queue owner, the effect keys they may begin); effect providers, each owning
effect keys and offering, or not, a receipt lookup by idempotency key; its own forward-only
SQL migrations (applied by ``accord migrate`` after accord's own, in the same ledger). The
broker topology is derived from these: one quorum queue per consumer class, bound by the
types its handlers take.

:meth:`App.validate` checks the declarations once, at start, before anything connects: a
handler for a type the catalog lacks, two classes on one queue, an effect key that no
provider owns (or two do)... each is a one-line
:class:`AppInvalid`.
"""

from __future__ import annotations

import importlib
import itertools
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accord.consumers import Handlers, InboxConflict
from accord.consumers.batch import ANY_TENANT
from accord.errors import AppInvalid, AppNotFound
from accord.jobs import JobConflict, Submitted, store
from accord.jobs.runner import JobContext, Registered
from accord.jobs.runner.context import declares
from accord.jobs.store import valid_lease
from accord.ops.errors import UnknownProjection
from accord.ops.projections import Projection
from accord.relay import Joined, Prepared, enqueue, enqueue_joined, prepare
from accord.schemas import migrate
from accord.schemas.db import Tx
from accord.schemas.errors import AccordError, UnknownEventType
from accord.schemas.events import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Catalog,
    Event,
    split_versioned_type,
    valid_tenant,
)
from accord.schemas.settings import MAX_LEASE_S, MAX_MESSAGE_BYTES
from accord.schemas.topology import DEFAULT_DELIVERY_LIMIT, Topology, WorkflowQueue

JobHandler = Callable[[JobContext], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Receipt:
    """A provider's evidence that it accepted the request sent under an idempotency key:
    its own receipt id and a reference a person can check (recorded in the audit row)."""

    receipt_id: str
    evidence: str


#: A provider's receipt lookup by idempotency key: the receipt, or None when the provider
#: definitely never accepted that key. Any exception means "no definite answer".
ReceiptLookup = Callable[[str], Awaitable[Receipt | None]]


@dataclass(frozen=True, slots=True)
class Provider:
    """An external system a job's effects reach, and the effect keys it owns.

    ``owns`` holds effect keys (``"mail.send"``) or key prefixes ending in a dot
    (``"mail."``). Only the owner's ``lookup`` is ever asked about an effect, so its "never
    accepted" is evidence only for keys it owns; without a lookup, its effects stay unknown
    until a person resolves them (``accord repair resolve-effect``).
    """

    name: str
    owns: tuple[str, ...]
    lookup: ReceiptLookup | None = None

    def owns_key(self, effect_key: str) -> bool:
        return declares(self.owns, effect_key)


@dataclass(frozen=True, slots=True)
class ConsumerClass:
    """One consumer workflow class: its handlers, its queue and the tenants it serves."""

    workflow: str
    handlers: Handlers
    #: Tenants served when neither ``--tenant`` nor ACCORD_CONSUMER_TENANTS names any.
    tenants: tuple[str, ...] = ()
    #: The queue's name below the topology prefix (default: the class name).
    queue: str | None = None
    delivery_limit: int = DEFAULT_DELIVERY_LIMIT
    #: Set for a projection: the statements that empty its tables before a rebuild.
    reset: tuple[str, ...] | None = None

    @property
    def queue_name(self) -> str:
        return self.queue or self.workflow


@dataclass(frozen=True, slots=True)
class JobClass:
    """How one workflow class's jobs run."""

    workflow: str
    handler: JobHandler
    owner: str
    timeout_s: float = 60.0
    max_attempts: int = 5
    #: The lease a claim takes (None: the worker's ACCORD_JOB_LEASE_S).
    lease_s: float | None = None
    #: The effect keys (or prefixes ending in a dot) the handler may begin.
    effects: tuple[str, ...] = ()


def _names(given: Sequence[str], what: str, declared: str) -> tuple[str, ...]:
    """``given`` as a tuple; AppInvalid for one string, which ``tuple()`` would split into its
    letters (``tenants="acme"`` served tenants a, c, m and e, and poisoned acme's events)."""
    if isinstance(given, str | bytes):
        raise AppInvalid(f"{what} takes a sequence of strings, not one string", name=declared,
                         given=str(given))  # fmt: skip
    return tuple(given)


@dataclass
class App:
    """What accord runs for one application. Build it at import time; pass it with
    ``--app module:attribute``. ``name`` is its migration component, its default topology
    prefix and its label in logs."""

    name: str
    catalog: Catalog
    migrations: Path | None = None
    #: The largest encoded payload its producers enqueue (``enqueue``'s limit); its
    #: consumers refuse to start with a smaller ACCORD_CONSUMER_MAX_BODY_BYTES.
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    consumers: dict[str, ConsumerClass] = field(default_factory=dict)
    jobs: dict[str, JobClass] = field(default_factory=dict)
    providers: list[Provider] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").isalnum() or not self.name.islower():
            raise AppInvalid(
                "an application name is lowercase letters, digits and _", name=self.name
            )
        if type(self.max_payload_bytes) is not int or not (
            1 <= self.max_payload_bytes <= MAX_MESSAGE_BYTES
        ):  # a consumer's body limit (ACCORD_CONSUMER_MAX_BODY_BYTES) stops there too
            raise AppInvalid(
                f"max_payload_bytes is a number of bytes from 1 to {MAX_MESSAGE_BYTES}"
                " (RabbitMQ's largest message)",
                name=self.name,
            )
        if self.name == migrate.ACCORD:
            raise AppInvalid("'accord' is accord's own migration component", name=self.name)
        if self.migrations is not None:
            self.migrations = Path(self.migrations)

    # -- declarations ----------------------------------------------------------------------

    def consumer(
        self,
        workflow: str,
        *,
        tenants: Sequence[str] = (),
        queue: str | None = None,
        delivery_limit: int = DEFAULT_DELIVERY_LIMIT,
    ) -> Handlers:
        """Declare a consumer workflow class; returns its handler registry (``@h.on(type, v)``)."""
        if type(delivery_limit) is not int or delivery_limit < 1:
            raise AppInvalid(
                "a delivery limit is a whole number of deliveries, at least 1",
                workflow=workflow,
                delivery_limit=delivery_limit,
            )
        return self._add_consumer(
            ConsumerClass(
                workflow,
                Handlers(workflow),
                _names(tenants, "tenants", workflow),
                queue,
                delivery_limit,
            )
        )

    def projection(
        self, workflow: str, *, reset: Sequence[str], tenants: Sequence[str] = ()
    ) -> Handlers:
        """Declare a projection: a consumer class whose handlers only write projection tables
        (deterministic in the event, idempotent), rebuilt by ``accord replay`` after running
        ``reset`` (statements that empty its tables)."""
        if not reset:
            raise AppInvalid("a projection needs the statements that empty it", workflow=workflow)
        return self._add_consumer(
            ConsumerClass(
                workflow,
                Handlers(workflow),
                _names(tenants, "tenants", workflow),
                reset=_names(reset, "reset", workflow),
            )
        )

    def _add_consumer(self, declared: ConsumerClass) -> Handlers:
        bad = [t for t in declared.tenants if t != ANY_TENANT and not valid_tenant(t)]
        if bad:  # no event could carry it: every delivery would be refused as another's
            raise AppInvalid(
                "a tenant must be an identifier an event can carry (or * for any)",
                workflow=declared.workflow,
                tenants=bad,
            )
        if declared.workflow in self.consumers:
            raise AppInvalid("this consumer class is declared twice", workflow=declared.workflow)
        self.consumers[declared.workflow] = declared
        return declared.handlers

    def job(
        self,
        workflow: str,
        *,
        owner: str,
        timeout_s: float = 60.0,
        max_attempts: int = 5,
        lease_s: float | None = None,
        effects: Sequence[str] = (),
    ) -> Callable[[JobHandler], JobHandler]:
        """Decorator: the job handler of ``workflow``, run by ``accord worker``. ``effects``:
        the keys (or prefixes ending in a dot) it may begin, each owned by one provider; any
        other key is refused at run time (EffectUndeclared, the job fails without a retry)."""

        _check_job(workflow, timeout_s, max_attempts, lease_s)

        def declare(handler: JobHandler) -> JobHandler:
            if workflow in self.jobs:
                raise AppInvalid("this job class is declared twice", workflow=workflow)
            self.jobs[workflow] = JobClass(
                workflow,
                handler,
                owner,
                timeout_s,
                max_attempts,
                lease_s,
                _names(effects, "effects", workflow),
            )
            return handler

        return declare

    def provider(
        self, name: str, *, owns: Sequence[str], lookup: ReceiptLookup | None = None
    ) -> Provider:
        """Declare an effect provider owning ``owns`` (keys, or prefixes ending in a dot)."""
        if any(p.name == name for p in self.providers):
            raise AppInvalid("this provider is declared twice", provider=name)
        declared = Provider(name, _names(owns, "owns", name), lookup)
        self.providers.append(declared)
        return declared

    # -- what the application's handlers call ---------------------------------------------

    def prepare(self, event: Event, **options: Any) -> Prepared:
        """``accord.relay.prepare`` with this application's catalog: ``event`` validated,
        encoded and digested before its transaction (typed errors here, nothing written), for
        ``enqueue`` or ``enqueue_joined`` to write with less work inside it."""
        options.setdefault("max_payload_bytes", self.max_payload_bytes)
        return prepare(event, catalog=self.catalog, **options)

    async def enqueue(self, tx: Tx, event: Event | Prepared, **options: Any) -> int:
        """``accord.relay.enqueue`` with this application's catalog and payload limit (the
        caller's transaction)."""
        options.setdefault("max_payload_bytes", self.max_payload_bytes)
        return await enqueue(tx, event, catalog=self.catalog, **options)

    async def enqueue_joined(
        self, tx: Tx, statement: str, *args: Any, event: Event | Prepared, **options: Any
    ) -> Joined:
        """``accord.relay.enqueue_joined`` with this application's catalog: the domain
        statement (``... RETURNING``) and the outbox row in one statement, the row only when
        the statement affected one."""
        options.setdefault("max_payload_bytes", self.max_payload_bytes)
        return await enqueue_joined(
            tx, statement, *args, event=event, catalog=self.catalog, **options
        )

    async def submit(self, tx: Tx, event: Event, *, workflow: str) -> Submitted:
        """Start the job of ``event``'s operation in class ``workflow``, in the consumer's
        transaction; idempotent on the operation id (a redelivery returns the existing job,
        whatever its state). The same operation with another digest raises InboxConflict, so
        the consumer poisons the delivery instead of overwriting the job."""
        digest = self.catalog.digest(event)
        declared = self.job_class(workflow)
        try:
            return await store.submit(
                tx,
                tenant=event.tenant,
                workflow=workflow,
                operation_id=event.operation_id,
                digest=digest,
                payload=dict(event.payload),
                max_attempts=declared.max_attempts,
            )
        except JobConflict as exc:
            raise InboxConflict(
                "the job for this operation was submitted with another digest",
                tenant=event.tenant,
                operation_id=event.operation_id,
                job_id=getattr(exc, "job_id", None),
                stored_digest=getattr(exc, "existing_digest", None),
                incoming_digest=digest,
            ) from exc

    # -- what the `accord` commands read ---------------------------------------------------

    def consumer_class(self, workflow: str) -> ConsumerClass:
        try:
            return self.consumers[workflow]
        except KeyError:
            raise AppInvalid(
                "the application declares no consumer class of this name",
                app=self.name,
                workflow=workflow,
                known=sorted(self.consumers),
            ) from None

    def job_class(self, workflow: str) -> JobClass:
        try:
            return self.jobs[workflow]
        except KeyError:
            raise AppInvalid(
                "the application declares no job handler for this class",
                app=self.name,
                workflow=workflow,
                known=sorted(self.jobs),
            ) from None

    def projection_of(self, workflow: str, tenants: Sequence[str] = ()) -> Projection:
        """The projection ``accord replay`` rebuilds (a class that starts work has none), for
        ``tenants`` (the ones its live consumer serves), else the declared ones; none, or
        ``*``: every tenant."""
        declared = self.consumers.get(workflow)
        if declared is None or declared.reset is None:
            raise UnknownProjection(
                workflow=workflow,
                known=sorted(n for n, c in self.consumers.items() if c.reset is not None),
            )
        served = tuple(tenants) or declared.tenants
        return Projection(workflow, declared.handlers, declared.reset, served)

    def registered(self, workflow: str) -> Registered:
        declared = self.job_class(workflow)
        return Registered(workflow, declared.handler, declared.timeout_s, declared.effects)

    def owner_of(self, effect_key: str) -> Provider | None:
        """The provider that owns ``effect_key`` (validate() makes it at most one)."""
        return next((p for p in self.providers if p.owns_key(effect_key)), None)

    def topology(self, prefix: str | None = None) -> Topology:
        """One quorum queue per consumer class, bound by the versioned types it handles."""
        return Topology(
            prefix or self.name,
            tuple(
                WorkflowQueue(c.workflow, tuple(c.handlers), c.delivery_limit, c.queue)
                for c in self.consumers.values()
            ),
        )

    def migration_chains(self) -> tuple[migrate.Chain, ...]:
        if self.migrations is None:
            return ()
        return (migrate.directory_chain(self.name, self.migrations),)

    def validate(self) -> App:
        """Check the declarations against each other; AppInvalid names the first problem."""
        queues: dict[str, str] = {}
        for declared in self.consumers.values():
            for versioned in declared.handlers:
                try:
                    self.catalog.get(*split_versioned_type(versioned))
                except UnknownEventType:
                    raise AppInvalid(
                        "a handler takes an event type the catalog does not declare",
                        app=self.name,
                        workflow=declared.workflow,
                        event_type=versioned,
                    ) from None
            other = queues.setdefault(declared.queue_name, declared.workflow)
            if other != declared.workflow:
                raise AppInvalid(
                    "two consumer classes bind one queue",
                    app=self.name,
                    queue=declared.queue_name,
                    workflows=sorted((other, declared.workflow)),
                )
        for a, b in itertools.combinations(self.providers, 2):
            shared = sorted(x for x in a.owns for y in b.owns if _overlap(x, y))
            if shared:  # an effect of both would be judged by whichever lookup came first
                raise AppInvalid(
                    "two providers own overlapping effect keys: each key needs one owner,"
                    " whose lookup alone is evidence",
                    app=self.name,
                    providers=[a.name, b.name],
                    keys=shared,
                )
        for job in self.jobs.values():
            for key in job.effects:
                owners = [p.name for p in self.providers if _covers(p, key)]
                if len(owners) != 1:
                    raise AppInvalid(
                        "an effect key no provider owns"
                        if not owners
                        else "an effect key two providers own",
                        app=self.name,
                        workflow=job.workflow,
                        effect_key=key,
                        owners=owners,
                    )
        if self.migrations is not None:
            self.migration_chains()  # a missing directory or two files of one version
        return self


def _overlap(x: str, y: str) -> bool:
    """Whether owned keys or prefixes ``x`` and ``y`` cover a key in common."""
    return x == y or (x.endswith(".") and y.startswith(x)) or (y.endswith(".") and x.startswith(y))


def _check_job(workflow: str, timeout_s: float, max_attempts: int, lease_s: float | None) -> None:
    """AppInvalid for numbers no job can run with (the database would refuse a submit with
    them, and a consumer's every message starting one would be poisoned)."""
    problems = {
        "timeout_s": not _positive(timeout_s),
        "max_attempts": type(max_attempts) is not int or max_attempts < 1,
        "lease_s": lease_s is not None and not valid_lease(lease_s),
    }
    wrong = [name for name, bad in problems.items() if bad]
    if wrong:
        raise AppInvalid(
            "a job class needs timeout_s > 0, max_attempts >= 1 and lease_s (if set) in"
            f" (0, {MAX_LEASE_S:g}] s",
            workflow=workflow,
            wrong=wrong,
        )


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _covers(provider: Provider, declared: str) -> bool:
    """A job's declared key (or prefix) falls within what ``provider`` owns."""
    if declared.endswith("."):
        return any(declared.startswith(owned) for owned in provider.owns if owned.endswith("."))
    return provider.owns_key(declared)


def load_app(spec: str) -> App:
    """The application named by ``module:attribute``, validated. AppNotFound in one line when
    the module does not import or the attribute is not an App; AppInvalid from validate()."""
    module_name, sep, attribute = spec.partition(":")
    if not module_name or not sep or not attribute:
        raise AppNotFound("--app takes module:attribute, e.g. myservice.accord_app:app", app=spec)
    try:
        module = importlib.import_module(module_name)
    except AccordError:
        raise  # the application's own declarations refused (AppInvalid, ...): one line
    except Exception as exc:
        raise AppNotFound(
            "the --app module does not import", app=spec, error=f"{type(exc).__name__}: {exc}"
        ) from exc
    found = getattr(module, attribute, None)
    if not isinstance(found, App):
        raise AppNotFound(
            "the --app attribute is not an accord.App",
            app=spec,
            found=type(found).__name__ if found is not None else "nothing",
        )
    return found.validate()
