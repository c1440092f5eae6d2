"""The argparse types of `accord`'s flags: each refuses at the command line (usage error,
exit 2, one line naming the flag) what the code below it would refuse later, with a
traceback, or worse, take (a NaN passes every comparison's guard)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from accord.schemas.settings import MAX_DURATION_S

#: The largest id a bigint column holds (jobs.jobs.job_id).
MAX_ID = 2**63 - 1


def seconds(*, positive: bool = False, maximum: float = MAX_DURATION_S) -> Callable[[str], float]:
    """A finite number of seconds, >= 0 (> 0 when ``positive``), at most ``maximum``."""
    least = "a positive" if positive else "a non-negative"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        low_ok = value > 0 if positive else value >= 0
        if not (math.isfinite(value) and low_ok and value <= maximum):
            raise argparse.ArgumentTypeError(
                f"{text!r}: {least} number of seconds, at most {maximum:g}"
            )
        return value

    return parse


def count(*, minimum: int = 1, maximum: int = 1_000_000) -> Callable[[str], int]:
    """A whole number in [minimum, maximum]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"{text!r}: a whole number from {minimum} to {maximum}"
            )
        return value

    return parse


#: A job id (`accord jobs list`): 1 .. the largest bigint.
job_id = count(maximum=MAX_ID)
#: A TCP port to listen on (0: any free one).
port = count(minimum=0, maximum=65535)


def text(value: str) -> str:
    """A non-empty string (surrounding blanks do not count) that PostgreSQL can hold: no NUL
    character, and UTF-8 throughout (Python keeps an argument's bytes that the locale could
    not decode as lone surrogates, which no database encoding takes)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    if "\x00" in value:
        raise argparse.ArgumentTypeError("must not contain a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        shown = value.encode("utf-8", "backslashreplace").decode("utf-8")
        raise argparse.ArgumentTypeError(
            f"{shown!r} is not UTF-8 text (bytes the terminal's encoding did not decode)"
        ) from None
    return value
