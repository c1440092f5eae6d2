"""One module per `accord` subcommand; each exposes ``register(subparsers)``.

The order of COMMANDS is the order `accord --help` lists them.
"""

COMMANDS = (
    "migrate",
    "register",
    "relay",
    "consume",
    "worker",
    "status",
    "jobs",
    "demo",
    "repair",
    "reconcile",
    "replay",
    "dead_letters",
    "metrics_serve",
    "gc_objects",
)
