"""SQL owned by the ``schemas`` package: the migration ledger. Values only as $n parameters."""

# A constant key for pg_advisory_lock: one migrator at a time per database.
MIGRATION_LOCK_KEY = 0x6163636F7264  # "accord"

# Take the migrator's session-level advisory lock (blocks until free).
LOCK = "SELECT pg_advisory_lock($1)"

# Release the migrator's advisory lock.
UNLOCK = "SELECT pg_advisory_unlock($1)"

# Create the ledger's schema and table if this database has never been migrated.
ENSURE_LEDGER = """
CREATE SCHEMA IF NOT EXISTS schemas;
CREATE TABLE IF NOT EXISTS schemas.migrations (
    version     integer PRIMARY KEY,
    name        text        NOT NULL,
    checksum    text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);
"""

# Does the ledger exist? (read-only probe, used by --check so it never writes)
LEDGER_EXISTS = "SELECT to_regclass('schemas.migrations') IS NOT NULL"

# Every applied migration, in order.
APPLIED = "SELECT version, name, checksum FROM schemas.migrations ORDER BY version"

# Record one applied migration (same transaction as the migration itself).
RECORD = "INSERT INTO schemas.migrations (version, name, checksum) VALUES ($1, $2, $3)"
