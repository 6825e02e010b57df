"""Human durations (``"500ms"``, ``"5m"``, ``"1h30m"``) to milliseconds and back, and times written
as ISO-8601 or as a duration ago (``"2h"``)."""

from __future__ import annotations

import argparse
import math
import re
from datetime import UTC, datetime, timedelta

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration_ms(value: str | int | float) -> int:
    """Return *value* in milliseconds.

    Numbers are taken as seconds; strings are one or more ``<number><unit>`` parts with
    units ``ms``, ``s``, ``m``, ``h``, ``d`` (``"1h30m"``). Raises ``ValueError`` naming the input.
    """
    if isinstance(value, bool):
        raise ValueError(f"duration {value!r} must be a string like '5m' or a number of seconds")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"duration {value!r} must be a finite number of seconds, not negative")
        return round(value * 1000)
    text = value.strip().lower()
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS_MS[match.group(2)]
        pos = match.end()
    if not text or pos != len(text):
        raise ValueError(f"duration {value!r} is not like '500ms', '30s', '5m', '1h' or '1d'")
    return round(total)


def format_duration_ms(ms: int) -> str:
    """Shortest exact rendering of *ms* (``300000`` -> ``"5m"``)."""
    if ms == 0:
        return "0s"
    for unit in ("d", "h", "m", "s"):
        size = _UNITS_MS[unit]
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


TIME_HELP = "an ISO-8601 time (UTC without a zone) or a duration ago (2h, 7d)"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def duration_or_seconds_ms(text: str) -> int:
    """A duration or plain seconds in milliseconds, within what a date can be moved by (about 2.7
    million years); ValueError or OverflowError otherwise."""
    ms = parse_duration_ms(float(text) if _is_number(text) else text)
    timedelta(milliseconds=ms)
    return ms


def time_or_ago(text: str, *, now: datetime | None = None) -> datetime:
    """A time from ISO-8601 (as written: without a zone it is naive), or a duration (or plain
    seconds) before ``now``, aware; ValueError or OverflowError for anything else."""
    text = text.strip()
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return (now or datetime.now(UTC)) - timedelta(milliseconds=duration_or_seconds_ms(text))


def moment(value: str, *, now: datetime | None = None) -> datetime:
    """A command line's time: an aware UTC time from ISO-8601 (UTC when it has no zone) or from a
    duration ago; ``argparse.ArgumentTypeError`` names both forms."""
    try:
        parsed = time_or_ago(value, now=now)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a time: write {TIME_HELP}, e.g. 2026-11-20T08:00:00Z or 2h"
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
