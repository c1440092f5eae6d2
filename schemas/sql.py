"""SQL owned by the ``schemas`` package: the migration ledger. Values only as $n parameters."""

# A constant key for pg_advisory_lock: one migrator at a time per database.
MIGRATION_LOCK_KEY = 0x6163636F7264  # "accord"

# Take the migrator's session-level advisory lock (blocks until free).
LOCK = "SELECT pg_advisory_lock($1)"

# Release the migrator's advisory lock.
UNLOCK = "SELECT pg_advisory_unlock($1)"

# Create the ledger's schema and table if this database has never been migrated. A ledger
# from before applications had migrations of their own (one chain, keyed by version) gains
# the component column, every old row belonging to accord's own chain.
ENSURE_LEDGER = """
CREATE SCHEMA IF NOT EXISTS schemas;
CREATE TABLE IF NOT EXISTS schemas.migrations (
    component   text        NOT NULL DEFAULT 'accord',
    version     integer     NOT NULL,
    name        text        NOT NULL,
    checksum    text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT migrations_pkey PRIMARY KEY (component, version)
);
ALTER TABLE schemas.migrations ADD COLUMN IF NOT EXISTS component text NOT NULL DEFAULT 'accord';
DO $$
BEGIN
    IF (SELECT count(*) FROM pg_index i JOIN pg_constraint c ON c.conindid = i.indexrelid
        WHERE c.conname = 'migrations_pkey' AND c.conrelid = 'schemas.migrations'::regclass) = 1
       AND (SELECT array_length(i.indkey::int2[], 1) FROM pg_index i
            JOIN pg_constraint c ON c.conindid = i.indexrelid
            WHERE c.conname = 'migrations_pkey' AND c.conrelid = 'schemas.migrations'::regclass) = 1
    THEN
        ALTER TABLE schemas.migrations DROP CONSTRAINT migrations_pkey;
        ALTER TABLE schemas.migrations
            ADD CONSTRAINT migrations_pkey PRIMARY KEY (component, version);
    END IF;
END $$;
"""

# Does the ledger exist? (read-only probe, used by --check so it never writes)
LEDGER_EXISTS = "SELECT to_regclass('schemas.migrations') IS NOT NULL"

# Does the ledger have its component column yet? (a ledger written before applications had
# migrations holds accord's chain only)
LEDGER_HAS_COMPONENT = """
SELECT EXISTS (SELECT 1 FROM information_schema.columns
               WHERE table_schema = 'schemas' AND table_name = 'migrations'
                 AND column_name = 'component')
"""

# Every applied migration of component $1, in order.
APPLIED = (
    "SELECT version, name, checksum FROM schemas.migrations WHERE component = $1 ORDER BY version"
)

# Every applied migration of a ledger without the component column (all of them accord's).
APPLIED_LEGACY = "SELECT version, name, checksum FROM schemas.migrations ORDER BY version"

# The components the ledger names besides accord's own (the applications migrated here).
COMPONENTS = "SELECT DISTINCT component FROM schemas.migrations WHERE component <> 'accord'"

# Record one applied migration of component $1 (same transaction as the migration itself).
RECORD = (
    "INSERT INTO schemas.migrations (component, version, name, checksum) VALUES ($1, $2, $3, $4)"
)

# Forget a retired row of accord's chain ($1 version, $2 the checksum it was applied with).
RETIRE = (
    "DELETE FROM schemas.migrations WHERE component = 'accord' AND version = $1 AND checksum = $2"
)

# Re-record a rewritten file of accord's chain: version $1 applied as checksum $2, now $3.
REWRITE = (
    "UPDATE schemas.migrations SET checksum = $3"
    " WHERE component = 'accord' AND version = $1 AND checksum = $2"
)
