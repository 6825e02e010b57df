"""The command line's shared argument syntax: one way to write a time and a duration everywhere.

- A **duration** (``--older-than``, ``--dead-retention``, ``--window``): ``90s``, ``15m``, ``2h``,
  ``7d``, ``1h30m``, ``500ms``, or a plain number of seconds.
- A **time** (``--since``, ``--until``): an ISO-8601 time (``2026-11-20T08:00:00Z``; one without a
  zone is UTC), or a duration meaning that long ago (``2h``: two hours before the command started).

A value that is neither fails at parse time with exit code 2 and a message showing both forms.
"""

from __future__ import annotations

import argparse

from retry_scheduler.core.durations import TIME_HELP, duration_or_seconds_ms, format_duration_ms, moment

__all__ = ["DURATION_HELP", "TIME_HELP", "duration", "duration_ms", "moment", "seconds"]

DURATION_HELP = "90s, 15m, 2h, 7d, 1h30m or seconds"


def duration_ms(value: str) -> int:
    """A duration in milliseconds; ``argparse.ArgumentTypeError`` names the accepted forms."""
    try:
        return duration_or_seconds_ms(value)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a duration: write it like {DURATION_HELP}"
        ) from None


def duration(value: str) -> str:
    """A duration, normalised to its shortest exact form (``"7d"``, ``"90s"``), for the Spark jobs."""
    return format_duration_ms(duration_ms(value))


def seconds(value: str) -> int:
    """A duration in whole seconds (at least 1)."""
    return max(1, round(duration_ms(value) / 1000))
