"""A caller's SQL statement read just far enough to join it to the outbox row: its own WITH
list (hoisted in front of the joined statement's, since a data-modifying CTE may stand only
at the top level) and the statement after it.

Only the lexical rules that decide where a top-level word can be are followed: comments
(``--`` and nested ``/* */``), quoted strings (``'…'``, ``E'…'`` with backslash escapes),
quoted identifiers and dollar quotes, and parentheses. PostgreSQL judges the rest when the
statement and the joined statement are prepared (relay.outbox._joined); a split in the wrong
place cannot prepare.
"""

from __future__ import annotations

import re

# The words that can begin the statement after a WITH list.
_MAIN = frozenset({"insert", "update", "delete", "select", "values", "table", "merge"})
_WORD = re.compile(r"[A-Za-z_\x80-\uffff][A-Za-z0-9_$\x80-\uffff]*")
_DOLLAR = re.compile(r"\$([A-Za-z_\x80-\uffff][A-Za-z0-9_\x80-\uffff]*)?\$")


def split_with(statement: str) -> tuple[str | None, str]:
    """``(ctes, main)``: what follows the statement's leading ``WITH`` up to its main
    statement (``RECURSIVE`` and every CTE, as written), and the main statement. ``(None,
    statement)`` for a statement that does not begin with WITH, or whose main statement
    cannot be found (an unterminated string or comment, a WITH with nothing after it)."""
    i = _skip_blank(statement, 0)
    word = _WORD.match(statement, i)
    if word is None or word.group().lower() != "with":
        return None, statement
    start = word.end()
    depth = 0
    i = start
    n = len(statement)
    while i < n:
        c = statement[i]
        if c.isspace():
            i += 1
        elif statement.startswith("--", i) or statement.startswith("/*", i):
            i = _skip_blank(statement, i)
        elif c == "'":
            i = _skip_quoted(statement, i, "'", backslash=False)
        elif c == '"':
            i = _skip_quoted(statement, i, '"', backslash=False)
        elif c == "$" and (dollar := _DOLLAR.match(statement, i)) is not None:
            end = statement.find(dollar.group(), dollar.end())
            i = n if end < 0 else end + len(dollar.group())
        elif c == "(":
            depth += 1
            i += 1
        elif c == ")":
            depth -= 1
            i += 1
        elif (word := _WORD.match(statement, i)) is not None:
            text = word.group()
            if text in ("e", "E") and statement.startswith("'", word.end()):
                i = _skip_quoted(statement, word.end(), "'", backslash=True)
            elif depth == 0 and text.lower() in _MAIN:
                return statement[start:i], statement[i:]
            else:
                i = word.end()
        else:
            i += 1
    return None, statement


def _skip_blank(s: str, i: int) -> int:
    """The index after any whitespace and comments from ``i`` (``/* */`` nest, as in
    PostgreSQL); the end of ``s`` for an unterminated comment."""
    n = len(s)
    while i < n:
        if s[i].isspace():
            i += 1
        elif s.startswith("--", i):
            end = s.find("\n", i)
            i = n if end < 0 else end + 1
        elif s.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if s.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif s.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        else:
            break
    return i


def _skip_quoted(s: str, i: int, quote: str, *, backslash: bool) -> int:
    """The index after the quoted text opening at ``i`` (a doubled quote is one quote; with
    ``backslash``, a backslash escapes the next character); the end of ``s`` if it never
    closes."""
    n = len(s)
    i += 1
    while i < n:
        c = s[i]
        if backslash and c == "\\":
            i += 2
        elif c == quote:
            if s.startswith(quote, i + 1):
                i += 2
            else:
                return i + 1
        else:
            i += 1
    return n
