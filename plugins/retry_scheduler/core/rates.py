"""A replay's pace as people give it: jobs per second per destination (``dlq replay --rate``, the
replay forms' and the page's rate, ``bulk-retry --rate``)."""

from __future__ import annotations

import contextlib
import math

#: The highest pace one may ask for (jobs per second per destination).
MAX_RATE = 1_000_000.0
#: A dead-letter replay without a rate of its own is not paced up to this many jobs per destination; a
#: larger one is paced at DEFAULT_REPLAY_RATE jobs per second per destination.
UNPACED_UP_TO = 10_000
DEFAULT_REPLAY_RATE = 1_000.0


class RateError(ValueError):
    """A rate that is not a number of jobs per second in range; the message says what to give."""


def parse_rate(value: object) -> float | None:
    """Jobs per second per destination from a number, text (``unlimited``, ``none`` or ``off``: 0) or
    nothing (None or empty: None, the caller's default). 0 means not paced. Anything else, a negative
    or non-finite number, one over :data:`MAX_RATE`, a boolean, raises :class:`RateError`."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip().lower() in ("unlimited", "none", "off"):
        return 0.0
    rate = math.nan
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        with contextlib.suppress(ValueError, OverflowError):
            rate = float(value)
    if not 0 <= rate <= MAX_RATE:
        raise RateError(
            f"rate {str(value)[:40]!r} must be jobs per second per destination, from 0 (no pace, or "
            f"'unlimited') to {MAX_RATE:,.0f}"
        )
    return rate
