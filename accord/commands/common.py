"""What every `accord` command shares: the application named by ``--app`` (accord.cli adds
the option to every command) or ``ACCORD_APP``."""

from __future__ import annotations

import argparse

from accord.app import App, load_app
from accord.errors import AppNotFound
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
