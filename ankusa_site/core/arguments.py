"""Argument types the management commands share: a bad value is argparse's own usage error,
before the command does anything."""

from __future__ import annotations

import argparse

# A day in seconds times ten thousand: larger is a typo, and timedelta overflows past 1e9 days.
MAX_SECONDS = 864_000_000


def seconds(text: str) -> float:
    """A number of seconds that makes a duration (no inf, nan or negative): ``float`` alone takes
    ``nan``, with which ``--max-seconds`` never ended and ``--pause`` failed in ``time.sleep``."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= MAX_SECONDS:  # nan fails every comparison
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from 0 to {MAX_SECONDS:,}")
    return value
