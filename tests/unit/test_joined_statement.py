"""Where a domain statement's own WITH list ends (schemas.statement.split_with): only the
lexical rules that decide where a top-level word can be. PostgreSQL judges the rest when
the joined statement is prepared (tests/integration/relay/test_enqueue_joined.py)."""

from __future__ import annotations

import pytest

from accord.schemas.statement import split_with

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


def test_a_string_continued_on_a_later_line_keeps_its_escapes() -> None:
    """scan.l's quote continuation: ``E'x'`` then a newline then ``'\\''`` is one E-string,
    so the ``')`` in the comment after it is a comment, not the end of the CTE. Found by a
    review: read as a plain string, the split fell inside the comment."""
    ctes = " x AS (SELECT E'x'\n'\\'') -- ') UPDATE t SET a = 1 RETURNING a, $q$\n"
    main = "UPDATE t SET a = 2 RETURNING a -- $q$"
    assert split_with(f"WITH{ctes}{main}") == (ctes, main)
    # control: with no newline between them they are two tokens (PostgreSQL refuses that)
    assert split_with("WITH x AS (SELECT 'a' 'b') " + MAIN) == (" x AS (SELECT 'a' 'b') ", MAIN)
    # `--` comments among the blanks still continue it (checked on PostgreSQL 15), a
    # `/* */` one does not
    for between in (
        " x AS (SELECT E'a' -- note\n  '\\' ) delete') ",
        " x AS (SELECT E'a'\n-- note\n'\\' ) delete') ",
    ):
        assert split_with(f"WITH{between}{MAIN}") == (between, MAIN)
    assert split_with(f"WITH x AS (SELECT 'a' /* c */\n 'b') {MAIN}")[1] == MAIN


def test_backslashes_escape_in_plain_strings_when_the_session_says_so() -> None:
    ctes = " x AS (SELECT 'it\\' ) update') "
    assert split_with(f"WITH{ctes}{MAIN}", standard_strings=False) == (ctes, MAIN)
    # control: standard strings (the default since PostgreSQL 9.1): the backslash is a
    # character, the quote after it ends the string, and the word after that is read
    assert split_with(f"WITH{ctes}{MAIN}")[1] != MAIN


def test_only_postgresqls_whitespace_is_blank() -> None:
    """A no-break space is part of an identifier to PostgreSQL, so ``$q$`` after it is no
    dollar quote; the split must not open one."""
    ctes = " x AS (SELECT 1 AS a\u00a0$q$) "
    assert split_with(f"WITH{ctes}{MAIN}") == (ctes, MAIN)
