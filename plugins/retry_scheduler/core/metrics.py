"""What the ingest and publish loops report as metrics, independent of where the metrics go.

The loops call a :class:`Metrics` sink; under Airflow it is
:class:`retry_scheduler.airflow.metrics.AirflowMetrics`, which sends through Airflow's own metrics
layer (StatsD, OpenTelemetry or Datadog, whichever the deployment configured under ``[metrics]``),
elsewhere :class:`NoMetrics`. Every name is listed in :data:`METRICS` (and in docs/operations/alerts.md); Airflow's
``[metrics] statsd_prefix`` (``airflow``) goes in front of them.
"""

from __future__ import annotations

from typing import Protocol

#: name -> (kind, meaning). Kinds: counter (added per batch), gauge (last value), timer (milliseconds).
METRICS: dict[str, tuple[str, str]] = {
    "retry_scheduler.ingest.records": ("counter", "records read from the retry topics"),
    "retry_scheduler.ingest.stored": ("counter", "records stored as new jobs (the rest were duplicates)"),
    "retry_scheduler.ingest.duplicates": ("counter", "records already stored (redelivered offsets)"),
    "retry_scheduler.ingest.invalid": ("counter", "records stored dead as invalid (bad headers or input)"),
    "retry_scheduler.ingest.dead": ("counter", "records dead at ingest (invalid, fatal, expired, requested)"),
    "retry_scheduler.ingest.batch_size": ("gauge", "records in the last stored batch"),
    "retry_scheduler.ingest.adopted.spring": (
        "counter",
        "letters read from Spring Kafka's dead-letter topics",
    ),
    "retry_scheduler.ingest.adopted.connect": (
        "counter",
        "letters read from Kafka Connect's dead-letter topics",
    ),
    "retry_scheduler.ingest.adopted.streams": (
        "counter",
        "letters read from Kafka Streams' dead-letter topics",
    ),
    "retry_scheduler.ingest.adopted.share": ("counter", "letters read from share groups' dead-letter topics"),
    "retry_scheduler.ingest.letters_unreadable": (
        "counter",
        "pointer-only letters whose source record could not be read (kept without a destination)",
    ),
    "retry_scheduler.publish.published": ("counter", "due jobs acknowledged by the broker and marked"),
    "retry_scheduler.publish.dead_published": ("counter", "dead jobs published to their DLQ topic"),
    "retry_scheduler.publish.delivery_failures": (
        "counter",
        "deliveries that failed (retried after backoff)",
    ),
    "retry_scheduler.publish.batch_size": ("gauge", "jobs claimed in the last round"),
    "retry_scheduler.publish.backlog_due": (
        "gauge",
        "jobs due now and not yet published (counted to 100 000)",
    ),
    "retry_scheduler.publish.oldest_overdue_s": ("gauge", "seconds the oldest due job has waited (0: none)"),
    "retry_scheduler.publish.lateness_p50": ("timer", "median publish lateness of the last 10 s, ms"),
    "retry_scheduler.publish.lateness_p99": (
        "timer",
        "99th percentile publish lateness of the last 10 s, ms",
    ),
    "retry_scheduler.breakers.open": (
        "gauge",
        "destinations whose breaker is open or probing: their due jobs are paused",
    ),
    "retry_scheduler.breakers.paused": ("gauge", "jobs paused by the destinations' breakers"),
    "retry_scheduler.breakers.opened": ("counter", "times a destination's breaker opened"),
    "retry_scheduler.chains.waiting": (
        "gauge",
        "ordered mode: records waiting in a chain, behind an earlier record of their key",
    ),
    "retry_scheduler.chains.waiting_chains": ("gauge", "ordered mode: chains with records waiting"),
    "retry_scheduler.chains.oldest_waiting_s": (
        "gauge",
        "ordered mode: seconds the oldest waiting record has waited",
    ),
    "retry_scheduler.chains.stuck": (
        "gauge",
        "ordered mode: chains waiting for a head the scheduler no longer has (published, or never stored)",
    ),
    "retry_scheduler.chains.oldest_stuck_s": (
        "gauge",
        "ordered mode: seconds the oldest record of a stuck chain has waited (0: none)",
    ),
}

#: How often (seconds) the publish loop reads the backlog and lateness gauges.
SNAPSHOT_EVERY_S = 10.0


class Metrics(Protocol):
    """Where loop metrics go; ``name`` is a key of :data:`METRICS`."""

    def incr(self, name: str, count: int = 1) -> None: ...

    def gauge(self, name: str, value: float) -> None: ...

    def timing(self, name: str, ms: float) -> None: ...


class NoMetrics:
    """Metrics that go nowhere (the loops outside Airflow, tests of the loops)."""

    def incr(self, name: str, count: int = 1) -> None:
        pass

    def gauge(self, name: str, value: float) -> None:
        pass

    def timing(self, name: str, ms: float) -> None:
        pass
