"""A provider simulator: the external service the demo's worker calls as an effect.

A real HTTP server on loopback (127.0.0.1 only) with its own durable evidence: every request
it accepts is committed to a SQLite file (``synchronous=FULL``) *before* it answers. It honours
an idempotency key (the same key again returns the original receipt and records nothing),
answers receipt lookups by key, and injects faults per request (headers ``X-Accord-Fault``,
``X-Accord-Fault-Delay``) or globally (:meth:`ProviderServer.set_fault`, ``PUT /admin/fault``):

* ``fail_before_accept`` 500 ``{"accepted": false}``, nothing recorded;
* ``drop_after_accept``  the request is recorded, then the connection is reset unanswered;
* ``slow``               the request is recorded, the answer comes ``delay`` seconds later.

Routes: ``POST /reports`` (header ``Idempotency-Key``, JSON body), ``GET /reports/<key>``,
``GET /evidence``, ``GET /stats``, ``PUT /admin/fault``. Run it in-process
(``with ProviderServer(db) as server`` or ``async with``) or as a process:
``python -m accord.demo.provider --port P --db PATH``. :class:`ProviderClient` is the async client;
its errors (accord.demo.provider.errors) tell the effect runner what it may do next.
"""

from accord.demo.provider.client import ProviderClient
from accord.demo.provider.errors import (
    ProviderAmbiguous,
    ProviderConflict,
    ProviderError,
    ProviderLookupFailed,
    ProviderRefused,
)
from accord.demo.provider.server import Evidence, ProviderServer
from accord.demo.provider.wire import Fault, Receipt

__all__ = [
    "Evidence",
    "Fault",
    "ProviderAmbiguous",
    "ProviderClient",
    "ProviderConflict",
    "ProviderError",
    "ProviderLookupFailed",
    "ProviderRefused",
    "ProviderServer",
    "Receipt",
]
