"""SQL text read just far enough for two questions: where a caller's statement's own WITH
list ends, to join it to the outbox row (``split_with``: the list is hoisted in front of the
joined statement's, since a data-modifying CTE may stand only at the top level); and whether
a migration file begins or ends a transaction itself (``transaction_control``: each file is
applied in one transaction of its own, and a COMMIT in it would commit part of the file).

Only the lexical rules that decide where a top-level word can be are followed, as
PostgreSQL's scanner (src/backend/parser/scan.l) states them: its whitespace, comments
(``--`` and nested ``/* */``), quoted strings (``'…'``, with backslash escapes in ``E'…'``
and, when the session's ``standard_conforming_strings`` is off, in ``'…'`` too; a string
continued on a later line), quoted identifiers, dollar quotes and parentheses. PostgreSQL
judges the rest when the statement and the joined statement are prepared, and
relay.outbox._joined checks that the joined statement returns what the statement returns.
"""

from __future__ import annotations

import re

# The words that can begin the statement after a WITH list.
_MAIN = frozenset({"insert", "update", "delete", "select", "values", "table", "merge"})
_WORD = re.compile(r"[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_$\x80-\U0010ffff]*")
_DOLLAR = re.compile(r"\$([A-Za-z_\x80-\U0010ffff][A-Za-z0-9_\x80-\U0010ffff]*)?\$")
# scan.l's {space}: nothing else is whitespace (a no-break space is part of an identifier).
_SPACE = frozenset(" \t\n\r\f\v")
# After a string's closing quote, blanks with a newline among them, then a quote: the same
# string goes on (scan.l's {quotecontinue}: `--` comments may stand among the blanks, never
# a `/* */` one).
_CONTINUE = re.compile(r"(?:[ \t\f]|--[^\n\r]*)*[\n\r](?:[ \t\n\r\f\v]+|--[^\n\r]*[\n\r])*'")


def split_with(statement: str, *, standard_strings: bool = True) -> tuple[str | None, str]:
    """``(ctes, main)``: what follows the statement's leading ``WITH`` up to its main
    statement (``RECURSIVE`` and every CTE, as written), and the main statement. ``(None,
    statement)`` for a statement that does not begin with WITH, or whose main statement
    cannot be found (an unterminated string or comment, a WITH with nothing after it).
    ``standard_strings``: the session's ``standard_conforming_strings`` (off: a backslash
    escapes in every string)."""
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
        if c in _SPACE:
            i += 1
        elif statement.startswith("--", i) or statement.startswith("/*", i):
            i = _skip_blank(statement, i)
        elif c == "'":
            i = _skip_string(statement, i, backslash=not standard_strings)
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
                i = _skip_string(statement, word.end(), backslash=True)
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
        if s[i] in _SPACE:
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


def _skip_string(s: str, i: int, *, backslash: bool) -> int:
    """The index after the string constant opening at ``i``, with its continuations on later
    lines (each read with the same escapes)."""
    i = _skip_quoted(s, i, "'", backslash=backslash)
    while (more := _CONTINUE.match(s, i)) is not None:
        i = _skip_quoted(s, more.end() - 1, "'", backslash=backslash)
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


# Statements that begin, end or abort a transaction (with PREPARE TRANSACTION, below).
_TRANSACTION = frozenset({"begin", "start", "commit", "end", "rollback", "abort"})


def transaction_control(script: str, *, standard_strings: bool = True) -> str | None:
    """The first statement of ``script`` (several statements, as a migration file holds them)
    that begins, ends or aborts a transaction, by its first words (``BEGIN``, ``START
    TRANSACTION``, ``COMMIT``, ``END``, ``ROLLBACK`` but ``ROLLBACK TO``, ``ABORT``, ``PREPARE
    TRANSACTION``); None when there is none. Quoted text, comments, dollar quotes (PL/pgSQL
    bodies) and the statements of a ``BEGIN ATOMIC`` body (a SQL-standard function body, read
    through to its ``END``) never count."""
    i, n = 0, len(script)
    start, depth, atomic = True, 0, 0  # the next word begins a statement; ( ); BEGIN ATOMIC
    while i < n:
        c = script[i]
        if c in _SPACE:
            i += 1
            continue
        if script.startswith("--", i) or script.startswith("/*", i):
            i = _skip_blank(script, i)
            continue
        if c == ";":
            start = start or depth == 0
            i += 1
            continue
        word = _WORD.match(script, i)
        if word is None:
            i = _skip_other(script, i, standard_strings)
            depth += {"(": 1, ")": -1}.get(c, 0)
            start = False
            continue
        text, i = word.group().lower(), word.end()
        if text == "e" and script.startswith("'", i):
            i, start = _skip_string(script, i, backslash=True), False
            continue
        after = _next_word(script, i)
        if start and atomic and text == "end":
            atomic -= 1
        elif text == "begin" and after == "atomic":
            atomic += 1
        elif start and not atomic and _controls(text, after):
            return f"{text} {after}".upper() if text in ("start", "prepare") else text.upper()
        start = False
    return None


def _controls(word: str, after: str) -> bool:
    """Whether a statement beginning with ``word`` ``after`` begins, ends or aborts a
    transaction (``ROLLBACK TO`` returns to a savepoint; ``PREPARE`` alone names a query)."""
    if word == "rollback":
        return after != "to"
    if word in ("start", "prepare"):
        return after == "transaction"
    return word in _TRANSACTION


def _skip_other(s: str, i: int, standard_strings: bool) -> int:
    """The index after the quoted text, dollar quote or single character at ``i``."""
    c = s[i]
    if c == "'":
        return _skip_string(s, i, backslash=not standard_strings)
    if c == '"':
        return _skip_quoted(s, i, '"', backslash=False)
    if c == "$" and (dollar := _DOLLAR.match(s, i)) is not None:
        end = s.find(dollar.group(), dollar.end())
        return len(s) if end < 0 else end + len(dollar.group())
    return i + 1


def _next_word(s: str, i: int) -> str:
    """The word after ``i`` (blanks and comments skipped), lower-case; '' when none."""
    word = _WORD.match(s, _skip_blank(s, i))
    return word.group().lower() if word is not None else ""
