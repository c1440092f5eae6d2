"""Where a domain statement's own WITH list ends (relay.statement.split_with): only the
lexical rules that decide where a top-level word can be. PostgreSQL judges the rest when
the joined statement is prepared (tests/integration/relay/test_enqueue_joined.py)."""

from __future__ import annotations

import pytest

from accord.relay.statement import split_with

MAIN = "UPDATE t SET a = 1 WHERE id = $1 RETURNING id"


@pytest.mark.parametrize(
    "ctes",
    [
        " x AS (SELECT 1) ",
        " RECURSIVE x(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM x WHERE n < 3) ",
        " x AS NOT MATERIALIZED (SELECT ')' AS delete), y AS (SELECT \"update (\" FROM z) ",
        " x AS (SELECT $$ ) insert $$, $tag$ $$ ( $tag$, $2) ",
        " x AS (SELECT E'\\' ) select', 'it''s )') ",
        " x AS (SELECT 1) -- ) delete\n /* ( /* select */ ) */ ",
        " x AS (INSERT INTO n (v) VALUES ($1) RETURNING v), y AS (DELETE FROM m RETURNING 1) ",
        " x AS (SELECT a$b, e FROM t) ",
    ],
)
def test_the_with_list_ends_where_the_main_statement_begins(ctes: str) -> None:
    assert split_with(f"WITH{ctes}{MAIN}") == (ctes, MAIN)
    # leading blanks and comments, and any case
    assert split_with(f" -- lead\n/* c */ with{ctes}{MAIN}") == (ctes, MAIN)


@pytest.mark.parametrize(
    "statement",
    [
        MAIN,
        "INSERT INTO t (a) VALUES ('WITH x AS (SELECT 1) DELETE') RETURNING a",
        "withheld",  # a word that begins with "with"
        "WITH x AS (SELECT 1)",  # no main statement
        "WITH x AS (SELECT 'unclosed) UPDATE t SET a = 1 RETURNING a",
        "WITH x AS (SELECT 1) /* unclosed UPDATE t SET a = 1 RETURNING a",
    ],
)
def test_no_with_list_or_no_main_statement_leaves_the_statement_whole(statement: str) -> None:
    assert split_with(statement) == (None, statement)
