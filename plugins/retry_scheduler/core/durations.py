"""Human durations (``"500ms"``, ``"5m"``, ``"1h30m"``) to milliseconds and back."""

from __future__ import annotations

import math
import re

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
