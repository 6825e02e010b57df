"""The command line's shared argument syntax: one way to write a time and a duration everywhere.

- A **duration** (``--older-than``, ``--dead-retention``, ``--window``): ``90s``, ``15m``, ``2h``,
  ``7d``, ``1h30m``, ``500ms``, or a plain number of seconds.
- A **time** (``--since``, ``--until``): an ISO-8601 time (``2026-11-20T08:00:00Z``; one without a
  zone is UTC), or a duration meaning that long ago (``2h``: two hours before the command started).

A value that is neither fails at parse time with exit code 2 and a message showing both forms.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

from retry_scheduler.core.durations import format_duration_ms, parse_duration_ms

DURATION_HELP = "90s, 15m, 2h, 7d, 1h30m or seconds"
TIME_HELP = "an ISO-8601 time (UTC without a zone) or a duration ago (2h, 7d)"


def _ms(text: str) -> int:
    """A duration or plain seconds in milliseconds, within what a date can be moved by (about 2.7
    million years); ValueError or OverflowError otherwise."""
    ms = parse_duration_ms(float(text) if _is_number(text) else text)
    timedelta(milliseconds=ms)
    return ms


def duration_ms(value: str) -> int:
    """A duration in milliseconds; ``argparse.ArgumentTypeError`` names the accepted forms."""
    try:
        return _ms(value)
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


def moment(value: str, *, now: datetime | None = None) -> datetime:
    """An aware UTC time from ISO-8601 (UTC when it has no zone) or from a duration ago."""
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        try:
            return (now or datetime.now(UTC)) - timedelta(milliseconds=_ms(text))
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a time: write {TIME_HELP}, e.g. 2026-11-20T08:00:00Z or 2h"
            ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
