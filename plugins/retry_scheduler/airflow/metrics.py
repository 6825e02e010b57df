"""Loop metrics through Airflow's metrics layer: the deployment's ``[metrics]`` settings decide where.

In a task process Airflow has set its stats backend up (StatsD, OpenTelemetry or Datadog, or none
when ``[metrics]`` turns them off); this sink only names and sends. A metric that cannot be sent is
dropped with a debug line: metrics never stop a loop.
"""

from __future__ import annotations

import logging
from typing import Any

from retry_scheduler.core.metrics import METRICS

log = logging.getLogger(__name__)


def _stats() -> Any:
    try:
        from airflow.sdk.observability import stats  # Airflow 3.2+

        return stats
    except ImportError:  # Airflow 3.1
        from airflow.stats import Stats

        return Stats


class AirflowMetrics:
    """:class:`retry_scheduler.core.metrics.Metrics` sent with Airflow's ``Stats``."""

    def __init__(self) -> None:
        self._stats = _stats()

    def _send(self, kind: str, name: str, value: float) -> None:
        if name not in METRICS:
            raise ValueError(f"unknown metric {name!r}: add it to retry_scheduler.core.metrics.METRICS")
        try:
            if kind == "incr":
                self._stats.incr(name, count=int(value))
            elif kind == "gauge":
                self._stats.gauge(name, value)
            else:
                self._stats.timing(name, value)
        except Exception:  # a metrics backend must never stop the loop
            log.debug("metric %s not sent", name, exc_info=True)

    def incr(self, name: str, count: int = 1) -> None:
        if count:
            self._send("incr", name, count)

    def gauge(self, name: str, value: float) -> None:
        self._send("gauge", name, value)

    def timing(self, name: str, ms: float) -> None:
        self._send("timing", name, ms)
