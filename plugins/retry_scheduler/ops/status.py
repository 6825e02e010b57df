"""What ``retry-scheduler status`` reads: the jobs by status, lateness, the ordered mode's holds,
and the breakers (the command line formats them)."""

from __future__ import annotations

from retry_scheduler.core.config import Settings
from retry_scheduler.core.policy import DEFAULT_DLQ_TOPIC
from retry_scheduler.db.breakers import BreakerStatus
from retry_scheduler.db.readings import StatusReading
from retry_scheduler.db.store import Store


def read_status(
    database_url: str, destination: str | None, window_s: int
) -> tuple[StatusReading, list[BreakerStatus]]:
    """The store's status reading (of ``destination``, lateness over ``window_s``) and the breakers
    not closed or holding jobs (and the destination's)."""
    with Store(database_url) as store:
        reading = store.readings.status(destination=destination, window_s=window_s)
        return reading, store.breakers.statuses([destination] if destination else ())


def topics_at_risk(settings: Settings) -> dict[str, str]:
    """The service's own topics (retry, delay, adopted, holds, and the default DLQ) whose replication
    loses records with one broker on this cluster, with why; ``{"": why}`` when Kafka does not answer."""
    from retry_scheduler.loops.kafka import topics_at_risk as at_risk

    return at_risk(settings, [*settings.own_topics, DEFAULT_DLQ_TOPIC], timeout_s=3.0)


def require_database(database_url: str) -> None:
    """Raise :class:`~retry_scheduler.db.connection.StoreError` (saying what to do) unless the
    database answers and its schema is migrated."""
    Store(database_url).close()
