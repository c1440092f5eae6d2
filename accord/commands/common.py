"""What every `accord` command shares: the application named by ``--app`` (accord.cli adds
the option to every command) or ``ACCORD_APP``."""

from __future__ import annotations

import argparse

from accord.app import App, load_app
from accord.consumers.batch import ANY_TENANT
from accord.consumers.inbox import PRUNE_MARGIN_S, replay_horizon_s
from accord.errors import AppNotFound, SettingsInvalid
from accord.schemas.errors import ConfigError
from accord.schemas.events import valid_tenant
from accord.schemas.settings import Settings


def app_spec(args: argparse.Namespace, settings: Settings) -> str:
    return str(getattr(args, "app", None) or settings.app)


def require_app(args: argparse.Namespace, settings: Settings) -> App:
    """The application this command runs for; AppNotFound (one line) when none is given."""
    spec = app_spec(args, settings)
    if not spec:
        raise AppNotFound(
            f"`accord {args.command}` needs an application: pass --app MODULE:ATTRIBUTE"
        )
    return load_app(spec)


def optional_app(args: argparse.Namespace, settings: Settings) -> App | None:
    """The application, when one is given (commands that also work on accord's tables alone)."""
    spec = app_spec(args, settings)
    return load_app(spec) if spec else None


def prefix(app: App, settings: Settings) -> str:
    """The broker names' prefix: ACCORD_TOPOLOGY_PREFIX, else the application's name."""
    return settings.topology_prefix or app.name


def check_retention(settings: Settings) -> None:
    """Raise SettingsInvalid (one line, exit 2) unless every retention outlives the replay
    horizon: a finished job (its operation key) and a poison record must outlive every
    redelivery that could still arrive, and the repair audit must outlive the jobs it audits."""
    horizon = replay_horizon_s(settings.inbox_replay_window_s)
    for name in ("jobs_retention_s", "poison_retention_s"):
        value = getattr(settings, name)
        if value < horizon:
            raise SettingsInvalid(
                f"ACCORD_{name.upper()}={value:.0f} is shorter than the replay horizon"
                f" (ACCORD_INBOX_REPLAY_WINDOW_S={settings.inbox_replay_window_s:.0f}"
                f" + {PRUNE_MARGIN_S:.0f} s = {horizon:.0f} s): a redelivery could outlive it"
            )
    if settings.audit_retention_s < settings.jobs_retention_s:
        raise SettingsInvalid(
            f"ACCORD_AUDIT_RETENTION_S={settings.audit_retention_s:.0f} is shorter than"
            f" ACCORD_JOBS_RETENTION_S={settings.jobs_retention_s:.0f}: the audit must outlive"
            " the jobs it audits"
        )


def served_tenants(given: list[str], settings: Settings, declared: tuple[str, ...]) -> list[str]:
    """The tenants a consumer class serves: ``--tenant`` (``given``), else
    ACCORD_CONSUMER_TENANTS (comma-separated), else its declaration; each one an event can
    carry, or ``*``. Raises ConfigError naming the others (no event carries them: every
    delivery would be refused as another tenant's)."""
    tenants = given or [t.strip() for t in settings.consumer_tenants.split(",")]
    tenants = [t for t in tenants if t] or list(declared)
    bad = [t for t in tenants if t != ANY_TENANT and not valid_tenant(t)]
    if bad:
        raise ConfigError(
            "not a tenant an event can carry: one tenant per --tenant, and"
            " ACCORD_CONSUMER_TENANTS separated by commas",
            tenants=bad,
        )
    return tenants
