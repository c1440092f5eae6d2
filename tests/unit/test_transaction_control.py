"""Whether a migration file begins or ends a transaction itself
(schemas.statement.transaction_control): only statements that do count, never text in
quotes, comments, dollar quotes (PL/pgSQL bodies) or a BEGIN ATOMIC body."""

from __future__ import annotations

import pytest

from accord.schemas.statement import transaction_control

CASES = [
    ("CREATE TABLE a (x int); ALTER TABLE a ADD y int;", None),
    ("BEGIN; ALTER TABLE a ADD y int; COMMIT;", "BEGIN"),
    ("ALTER TABLE a ADD y int;\nCOMMIT;\nCREATE INDEX i ON a (y);", "COMMIT"),
    ("start transaction; select 1", "START TRANSACTION"),
    ("SELECT CASE WHEN true THEN 1 END; END;", "END"),
    ("SELECT (1); abort;", "ABORT"),
    ("ROLLBACK;", "ROLLBACK"),
    ("PREPARE TRANSACTION 'x'", "PREPARE TRANSACTION"),
    # controls: the same words where they begin or end nothing
    ("DO $$ BEGIN PERFORM 1; END $$; SELECT 1;", None),
    ("CREATE FUNCTION g() RETURNS int AS $f$ BEGIN RETURN 1; END $f$ LANGUAGE plpgsql;", None),
    ("CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; SELECT 2; END;", None),
    ("CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END; COMMIT;", "COMMIT"),
    ("SELECT 'COMMIT'; -- COMMIT\n/* ROLLBACK */ SELECT \"end\";", None),
    ("COMMENT ON TABLE a IS 'BEGIN; COMMIT'; SELECT E'\\'; COMMIT';", None),
    ("SAVEPOINT s; ROLLBACK TO SAVEPOINT s; RELEASE s;", None),
    ("PREPARE q AS SELECT 1; EXECUTE q;", None),
    ("START_AT := 1", None),
]


@pytest.mark.parametrize(("script", "control"), CASES, ids=[c[0][:40] for c in CASES])
def test_only_statements_that_begin_or_end_a_transaction_count(
    script: str, control: str | None
) -> None:
    assert transaction_control(script) == control
