"""The composition root's errors: an application that cannot be loaded or does not add up::

AccordError
└── ConfigError
    ├── SettingsInvalid       an ACCORD_* variable has a value that cannot work
    └── AppError              the application given with --app cannot run
        ├── AppNotFound       --app does not import, or names no accord.App
        └── AppInvalid        the application's declarations contradict each other
"""

from __future__ import annotations

from accord.schemas.errors import ConfigError


class AppError(ConfigError):
    """The application given with --app cannot run."""

    reason = "app"


class AppNotFound(AppError):
    """No application: pass --app module:attribute (or set ACCORD_APP)."""

    reason = "app_not_found"


class AppInvalid(AppError):
    """The application's declarations contradict each other."""

    reason = "app_invalid"


class SettingsInvalid(ConfigError):
    """A setting in the environment has a value that cannot work."""

    reason = "settings_invalid"
