"""retry_monitor's thresholds: when each check fires, from the defaults and the Airflow Variable
``retry_monitor_thresholds`` (a JSON object of overrides; ``null`` turns a check off)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

VARIABLE = "retry_monitor_thresholds"


class ThresholdsError(ValueError):
    """The thresholds Variable is not valid; the message names the key and what it must be."""


@dataclass(frozen=True)
class Thresholds:
    """When each check fires (above the value); ``None`` turns a check off."""

    oldest_overdue_s: float | None = 60.0
    lateness_p99_s: float | None = 2.0
    dead_per_hour: float | None = 1000.0
    stuck_delivery_s: float | None = 600.0
    #: Records on the retry topics not ingested yet.
    consumer_lag: float | None = 100_000.0
    #: The largest share of its retry topic's retention the oldest record not ingested has used.
    ingest_retention_share: float | None = 0.5
    #: Records removed from the retry topics (retention) before the ingest read them (0: any).
    removed_unread: float | None = 0.0
    #: Dead jobs still off their DLQ topic a minute after they died (0: any).
    undelivered_dead: float | None = 0.0
    #: Pending jobs whose last five deliveries to their destination failed (0: any).
    failing_deliveries: float | None = 0.0
    #: Seconds the oldest record held in a stuck chain (ordered mode: its head is not at the
    #: scheduler) has waited.
    stuck_chain_s: float | None = 3600.0
    #: Destinations whose breaker holds their jobs (BREAKERS; 0: any).
    open_breakers: float | None = 0.0
    #: Share groups' letters of the last hour kept without their record (0: any).
    letters_unreadable: float | None = 0.0
    #: The largest share of its topic's retention a share group's letter's record had used when read.
    letter_retention_share: float | None = 0.5
    #: The lateness window, in seconds: jobs published in the last ``interval_s``.
    interval_s: int = 300

    @classmethod
    def from_json(cls, raw: str | None) -> Thresholds:
        """The defaults with the overrides of a JSON object, e.g. ``{"oldest_overdue_s": 120}``."""
        if raw is None or not raw.strip():
            return cls()
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ThresholdsError(f"Variable {VARIABLE} is not valid JSON: {exc}") from None
        return cls.from_mapping(data)

    @classmethod
    def from_mapping(cls, data: object) -> Thresholds:
        known = [f.name for f in fields(cls)]
        if not isinstance(data, dict):
            raise ThresholdsError(
                f'Variable {VARIABLE} must be a JSON object such as {{"oldest_overdue_s": 120}}, '
                f"not {type(data).__name__}"
            )
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                raise ThresholdsError(
                    f"Variable {VARIABLE}: unknown key {key!r}; the keys are {', '.join(known)}"
                )
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if key == "interval_s":
                if not number or value <= 0 or value != int(value):
                    raise ThresholdsError(
                        f"Variable {VARIABLE}: 'interval_s' must be a whole number of seconds above 0, "
                        f"not {value!r}"
                    )
                values[key] = int(value)
            elif value is None:
                values[key] = None
            elif not number or value < 0:
                raise ThresholdsError(
                    f"Variable {VARIABLE}: {key!r} must be a number >= 0, or null to turn the check off, "
                    f"not {value!r}"
                )
            else:
                values[key] = float(value)
        return cls(**values)
