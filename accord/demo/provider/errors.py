"""What a provider call can end in, drawn for the effect runner (DESIGN §7)::

AccordError
└── ProviderError            the provider call did not return a receipt
    ├── ProviderRefused      not accepted, nothing happened: safe to retry
    │                        (the effect failed before dispatch)
    ├── ProviderAmbiguous    sent, then no definite answer: the outcome is unknown,
    │                        reconcile by looking the idempotency key up
    ├── ProviderConflict     the idempotency key was already used with another body
    └── ProviderLookupFailed a receipt lookup got no definite answer (read-only: retry freely)
"""

from __future__ import annotations

from accord.schemas.errors import AccordError


class ProviderError(AccordError):
    """The provider call did not return a receipt."""

    reason = "provider"


class ProviderRefused(ProviderError):
    """The provider did not accept the request; nothing happened, so it is safe to retry."""

    reason = "provider_refused"


class ProviderAmbiguous(ProviderError):
    """The request was sent but no definite answer came back; its outcome is unknown."""

    reason = "provider_ambiguous"


class ProviderConflict(ProviderError):
    """The idempotency key was already used with a different body."""

    reason = "provider_conflict"


class ProviderLookupFailed(ProviderError):
    """The receipt lookup got no definite answer."""

    reason = "provider_lookup_failed"
