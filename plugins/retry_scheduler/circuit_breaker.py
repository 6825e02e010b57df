"""The consumer helper's circuit breaker: pause consuming while most records fail.

Spelled as the service's per-destination :class:`~retry_scheduler.core.breakers.Breaker` is:
``failure_rate``, ``min_records``, ``window`` and ``cool_down`` (durations: ``"30s"``, or a number of
seconds), and the states ``closed``, ``open`` and ``probing``::

    CircuitBreaker(failure_rate=0.5, window="30s", min_records=10, cool_down="30s")

0.4's ``window_s=`` and ``cooldown_s=`` still work, with a ``DeprecationWarning``, for one release;
``window_s``, ``cooldown_s`` and ``cool_down_s`` read the durations in seconds. (0.4 called the
probing state ``half-open``.)
"""

from __future__ import annotations

import warnings
from collections import deque
from typing import Any

from retry_scheduler.core.durations import parse_duration_ms

CLOSED, OPEN, PROBING = "closed", "open", "probing"


class CircuitBreaker:
    """Pause consuming while most records fail (closed -> open -> probing -> closed, or open again).

    :param failure_rate: open when at least this share of the records handled within ``window``
        failed, once there were ``min_records`` of them.
    :param window: how far back the share is counted (``"30s"``, or seconds).
    :param min_records: the fewest records within ``window`` before it may open.
    :param cool_down: how long to stay paused before one record is let through (probing).
    """

    def __init__(
        self,
        failure_rate: float = 0.5,
        window: str | float = "30s",
        min_records: int = 10,
        cool_down: str | float = "30s",
        *,
        window_s: float | None = None,
        cooldown_s: float | None = None,
    ) -> None:
        for old, new, value in (("window_s", "window", window_s), ("cooldown_s", "cool_down", cooldown_s)):
            if value is not None:
                warnings.warn(
                    f"CircuitBreaker({old}=) is deprecated: write {new}= (a duration like '30s', or seconds)",
                    DeprecationWarning,
                    stacklevel=2,
                )
        window = window if window_s is None else window_s
        cool_down = cool_down if cooldown_s is None else cooldown_s
        if (
            isinstance(failure_rate, bool)
            or not isinstance(failure_rate, int | float)
            or not 0 < failure_rate <= 1
        ):
            raise ValueError(f"failure_rate must be in (0, 1], not {failure_rate!r}")
        if isinstance(min_records, bool) or not isinstance(min_records, int) or min_records < 1:
            raise ValueError(f"min_records must be a whole number, at least 1, not {min_records!r}")
        self.failure_rate = failure_rate
        self.min_records = min_records
        self.window, self.cool_down = window, cool_down
        self._window_s = parse_duration_ms(window) / 1000
        self._cool_down_s = parse_duration_ms(cool_down) / 1000
        if self._window_s <= 0:
            raise ValueError(f"window must be above 0, not {window!r}")
        #: ``closed`` (consuming), ``open`` (paused), ``probing`` (one probe record let through).
        self.state = CLOSED
        #: State changes and probes so far: ``opened``, ``probes``, ``closed``.
        self.counts: dict[str, int] = {"opened": 0, "probes": 0, "closed": 0}
        self._outcomes: deque[tuple[float, bool]] = deque()
        self._opened_at = 0.0

    @property
    def window_s(self) -> float:
        return self._window_s

    @property
    def cool_down_s(self) -> float:
        return self._cool_down_s

    @property
    def cooldown_s(self) -> float:
        """0.4's name of :attr:`cool_down_s`."""
        return self._cool_down_s

    def __repr__(self) -> str:
        return (
            f"CircuitBreaker(failure_rate={self.failure_rate!r}, window={self.window!r}, "
            f"min_records={self.min_records!r}, cool_down={self.cool_down!r}, state={self.state!r})"
        )

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, CircuitBreaker):
            return NotImplemented
        mine = (self.failure_rate, self._window_s, self.min_records, self._cool_down_s)
        return mine == (other.failure_rate, other._window_s, other.min_records, other._cool_down_s)

    __hash__ = None  # type: ignore[assignment]  # it changes state

    def record(self, ok: bool, now: float) -> str | None:
        """Count one handled record; the new state when it changes (``open`` or ``closed``), else None."""
        if self.state == PROBING:
            self.counts["probes"] += 1
            if ok:
                self._outcomes.clear()
                self.state = CLOSED
                self.counts["closed"] += 1
                return CLOSED
            return self._open(now)
        self._outcomes.append((now, ok))
        while self._outcomes and self._outcomes[0][0] < now - self._window_s:
            self._outcomes.popleft()
        failed = sum(1 for _, good in self._outcomes if not good)
        if len(self._outcomes) >= self.min_records and failed >= self.failure_rate * len(self._outcomes):
            return self._open(now)
        return None

    def due_probe(self, now: float) -> bool:
        """Whether the cool-down is over: the next record is a probe (the state becomes probing)."""
        if self.state == OPEN and now - self._opened_at >= self._cool_down_s:
            self.state = PROBING
            return True
        return False

    def failure_summary(self) -> str:
        failed = sum(1 for _, good in self._outcomes if not good)
        return f"{failed} of {len(self._outcomes)} records failed in the last {self._window_s:g} s"

    def _open(self, now: float) -> str:
        self.state = OPEN
        self._opened_at = now
        self.counts["opened"] += 1
        return OPEN
