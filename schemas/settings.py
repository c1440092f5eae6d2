"""Settings: one frozen object, built once from the environment by the composition root.

Nothing else in accord reads ``os.environ``; modules receive the values they need.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_PG_DSN = "postgresql://postgres@127.0.0.1:5432/accord"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"

#: The longest duration a setting takes (about a century): a longer one overflows the
#: database's timestamps (`now() - interval`) after the process said it was ready.
MAX_DURATION_S = 100 * 365 * 24 * 3600.0


def duration_ok(value: object, *, positive: bool = False) -> bool:
    """Whether ``value`` is seconds every duration of accord's can hold: a number, >= 0 (> 0
    when ``positive``) and at most MAX_DURATION_S. A NaN, an infinity or 1e12 s passes a
    bare ``>= 0`` and fails later, in the database (out-of-range timestamps)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return (value > 0 if positive else value >= 0) and value <= MAX_DURATION_S


#: The longest lease a claim takes (jobs.store.valid_lease).
MAX_LEASE_S = 86_400.0
#: A broker name prefix: what RabbitMQ takes in every name built from it, with room for the
#: suffixes (`.wf.<class>.poison`) within its 255 bytes.
TOPOLOGY_PREFIX = r"^$|^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


#: RabbitMQ's largest message (max_message_size's own ceiling, 512 MiB).
MAX_MESSAGE_BYTES = 512 * 1024 * 1024


class Settings(BaseSettings):
    """accord's configuration (environment prefix ``ACCORD_``)."""

    # allow_inf_nan off: "inf" or "nan" for a duration passes every bound (a NaN compares
    # false) and fails later, at run time, after the process said it was ready.
    model_config = SettingsConfigDict(
        env_prefix="ACCORD_", frozen=True, extra="ignore", allow_inf_nan=False
    )

    # The application (module:attribute of an accord.App) the commands run for; --app wins.
    app: str = ""
    # Never empty: an empty DSN is libpq's defaults (another database, as the OS user).
    pg_dsn: str = Field(default=DEFAULT_PG_DSN, min_length=1)
    amqp_url: str = Field(default=DEFAULT_AMQP_URL, min_length=1)
    # Broker topology names (empty: the application's name); tests give each run its own.
    topology_prefix: str = Field(default="", pattern=TOPOLOGY_PREFIX)
    # Declare the topology at start (idempotent); false: only check it passively, so the
    # processes need no configure permission on the broker (deploy/rabbitmq/definitions.json).
    topology_declare: bool = True
    # Upper bounds on counts too: a count past what its statement or the broker takes passed
    # the settings and failed at run time (a LIMIT of 1e20 at the first claim).
    relay_batch: int = Field(default=200, gt=0, le=10_000)
    relay_in_flight: int = Field(default=256, gt=0, le=100_000)
    relay_publish_timeout_s: float = Field(default=10.0, gt=0, le=MAX_DURATION_S)
    relay_lease_s: float = Field(default=30.0, gt=0, le=MAX_DURATION_S)
    relay_poll_s: float = Field(default=1.0, gt=0, le=MAX_DURATION_S)
    # After a NOTIFY wakes an idle relay, wait this long so the events committed meanwhile
    # share one claim, publish and settle (0: claim at once).
    relay_linger_s: float = Field(default=0.01, ge=0, le=MAX_DURATION_S)
    # While a relay finds events at a sustained rate it promises to poll for this long
    # (renewed at half), and enqueues skip their NOTIFY meanwhile (0: never promise).
    relay_awake_s: float = Field(default=2.0, ge=0, le=60)
    relay_retention_s: float = Field(default=7 * 24 * 3600.0, ge=0, le=MAX_DURATION_S)
    relay_prune_batch: int = Field(default=1000, gt=0, le=10_000)
    relay_prune_every_s: float = Field(default=60.0, gt=0, le=MAX_DURATION_S)
    # Returns before a row is held as unroutable (a binding may appear a moment later).
    relay_unroutable_attempts: int = Field(default=3, gt=0, le=1000)
    # Hold rows larger than this before publishing (0: only the broker's own limit).
    relay_max_message_bytes: int = Field(default=0, ge=0, le=MAX_MESSAGE_BYTES)
    inbox_replay_window_s: float = Field(default=7 * 24 * 3600.0, gt=0, le=MAX_DURATION_S)
    consumer_prefetch: int = Field(default=64, gt=0, le=65535)  # AMQP: a short
    consumer_batch: int = Field(default=64, gt=0, le=65535)
    # After a batch's first delivery, wait this long for more to share its transaction and ack
    # (0: take what already arrived).
    consumer_batch_linger_s: float = Field(default=0.01, ge=0, le=MAX_DURATION_S)
    consumer_concurrency: int = Field(default=2, gt=0, le=1000)  # a connection each
    # The tenants a consumer serves, comma-separated ("*" for all); none means refuse to start.
    consumer_tenants: str = ""
    # A consumer poisons a message body larger than this (typed reason too_large), unread.
    consumer_max_body_bytes: int = Field(default=256 * 1024, gt=0, le=MAX_MESSAGE_BYTES)
    # A message that failed transiently is requeued after this long at its first delivery,
    # doubling with each delivery counted, at most 5 s (0: at once; consumers.batch's
    # RETRY_BACKOFF_MAX_S: a first wait above it would be that cap at every delivery).
    consumer_retry_backoff_s: float = Field(default=0.2, ge=0, le=5.0)
    job_lease_s: float = Field(default=60.0, gt=0, le=MAX_LEASE_S)
    # Once all of a worker's slots were taken, a freed slot waits this long before its claim,
    # so that the slots freeing meanwhile share one claim (0: claim at once).
    worker_claim_linger_s: float = Field(default=0.01, ge=0, le=MAX_DURATION_S)
    # Retention, tied to the replay horizon (inbox_replay_window_s + the inbox's prune margin):
    # finished, resolved jobs with their keys, effects and results, after jobs_retention_s;
    # repair audit rows after audit_retention_s (at least the jobs retention), and the replay
    # ledger (accord replay prunes it at its start, 0041); consumers'
    # poison records after poison_retention_s. The workers prune jobs (every
    # jobs_prune_every_s, batches of jobs_prune_batch), the consumers poison. The processes
    # refuse to start with a retention shorter than the horizon (check_retention).
    jobs_retention_s: float = Field(default=14 * 24 * 3600.0, ge=0, le=MAX_DURATION_S)
    audit_retention_s: float = Field(default=90 * 24 * 3600.0, ge=0, le=MAX_DURATION_S)
    poison_retention_s: float = Field(default=30 * 24 * 3600.0, ge=0, le=MAX_DURATION_S)
    jobs_prune_every_s: float = Field(default=60.0, gt=0, le=MAX_DURATION_S)
    jobs_prune_batch: int = Field(default=200, gt=0, le=10_000)
    journal_dir: str = "var/journal"
    # A worker seals its journal's live segment once this much was written to it (and at its
    # start), carrying forward only unresolved effects: a start reads about this much at most,
    # plus twice what is unresolved.
    journal_segment_bytes: int = Field(default=8 * 1024 * 1024, ge=64 * 1024, le=2**31)
    ledger_path: str = "var/authority.ledger"
    # The ledger in a separate PostgreSQL database instead of ledger_path (several hosts).
    ledger_pg_dsn: str = ""
    # How often processes compare the database with the ledger (restore detection).
    authority_check_s: float = Field(default=10.0, gt=0, le=MAX_DURATION_S)
    # Repairs (`accord repair`, `accord reconcile`) connect here (default pg_dsn) as this role.
    repair_pg_dsn: str = ""
    repair_role: str = "accord_repair"
    # `accord worker` executes jobs as this role (execution authority: no repair rights);
    # empty: as the DSN's own user.
    worker_role: str = "accord_worker"
    # `accord relay` and `accord consume` run as these roles (only their own grants; empty: as
    # the DSN's own user).
    relay_role: str = "accord_relay"
    consumer_role: str = "accord_consumer"
    # Unresolved effects older than this are escalated (never resolved by time).
    effect_escalate_after_s: float = Field(default=3600.0, ge=0, le=MAX_DURATION_S)
    # A provider's "never seen" is trusted only this long after the job's attempts could
    # last have sent (jobs.reconciliation.quiet_since, 0058): what a request in flight takes.
    reconcile_settle_s: float = Field(default=60.0, ge=0, le=MAX_DURATION_S)
    object_dir: str = "var/objects"
    metrics_port: int = Field(default=0, ge=0, le=65535)
    # Whether a relay's, consumer's or worker's /metrics also serves the status figures (the
    # gauges of `accord status`, a snapshot of the whole database per scrape). Off: they are
    # the same in every process, so one exporter serves them (`accord metrics-serve`, which
    # always does); each process serves its own figures, /healthz and /readyz.
    metrics_status: bool = False
    # How late a process loop may report in before /healthz calls it stuck.
    health_grace_s: float = Field(default=30.0, gt=0, le=MAX_DURATION_S)
    # Log lines: "text" (default) or "json" (one object per line, trace ids inside spans).
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"


def load_settings() -> Settings:
    """Read the environment once; call only from the composition root."""
    return Settings()
