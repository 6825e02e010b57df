"""The readings of the job store: ``status``, the publish loop's gauges, ``retry_monitor``'s figures
and its incident rows. A mixin of :class:`retry_scheduler.db.store.Store` (one connection); reads
only, but for the incident rows. Its SQL is the named queries of ``sql/queries.sql`` and
``sql/monitor.sql``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import psycopg

from retry_scheduler.core.jobs import HELD_DUE_MS
from retry_scheduler.db.breakers import BreakerStatus, breaker_statuses
from retry_scheduler.db.connection import joined, require_transaction
from retry_scheduler.db.schema import q

#: The due time of a job waiting in its chain (``held_by``), as PostgreSQL is sent it.
HELD_DUE_AT = datetime.fromtimestamp(HELD_DUE_MS / 1000, UTC)


@dataclass(frozen=True)
class Incident:
    """A check's state as stored in ``retry_alerts``."""

    firing: bool = False
    since: datetime | None = None
    #: A notification went out after the incident started.
    announced: bool = False


@dataclass(frozen=True)
class Lateness:
    """Publish lateness over a window, in seconds."""

    count: int
    p50_s: float | None
    p99_s: float | None
    max_s: float | None
    early: int


class ChainsWaiting(NamedTuple):
    """Ordered mode's records waiting in their key's chain (``waiting_count``): ``waiting`` pending
    records in ``chains`` chains, the oldest stored ``oldest_waiting_s`` ago; ``stuck`` chains wait for
    a head the scheduler no longer has, their oldest record for ``oldest_stuck_s``."""

    waiting: int = 0
    chains: int = 0
    oldest_waiting_s: float | None = None
    stuck: int = 0
    oldest_stuck_s: float | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any] | None) -> ChainsWaiting:
        if row is None:
            return cls()
        return cls(int(row[0]), int(row[1]), _seconds(row[2]), int(row[3]), _seconds(row[4]))

    def gauges(self) -> dict[str, float]:
        """The ``retry_scheduler.chains.*`` gauges (an age is 0 when nothing waits)."""
        return {"waiting": self.waiting, "waiting_chains": self.chains,
                "oldest_waiting_s": self.oldest_waiting_s or 0.0, "stuck": self.stuck,
                "oldest_stuck_s": self.oldest_stuck_s or 0.0}  # fmt: skip


class Overdue(NamedTuple):
    """The due job that has waited longest for its publish."""

    id: int
    destination: str
    due_at: datetime
    overdue_s: float


class VacuumState(NamedTuple):
    """The hot table's vacuum state: whether autovacuum runs on it, its dead and live rows, its last vacuum."""

    autovacuum: bool
    dead_rows: int
    live_rows: int
    last_vacuum: datetime | None


@dataclass(frozen=True)
class StatusReading:
    """What ``status`` shows: jobs by status, the ones waiting in a chain, dead ones by reason, the oldest overdue
    job, recent lateness and the hot table's vacuum state."""

    counts: dict[str, int]
    waiting: ChainsWaiting
    dead_by_reason: dict[str, int]
    oldest_overdue: Overdue | None
    lateness: Lateness
    vacuum: VacuumState


class Gauges(NamedTuple):
    """The publish loop's gauges: the due backlog (to 100 000), the oldest due job's wait, and
    lateness p50/p99 (None when nothing was published in the window)."""

    backlog_due: int
    oldest_overdue_s: float
    lateness_p50_s: float | None
    lateness_p99_s: float | None


class Delivery(NamedTuple):
    """Per topic: dead jobs not on their DLQ topic after the grace, jobs whose last deliveries all
    failed, and the last error."""

    topic: str
    undelivered_dead: int
    failing: int
    error: str | None


class StuckDelivery(NamedTuple):
    """The delivery that has waited longest: its job, target topic, failed attempts and last error."""

    id: int
    target: str
    failures: int
    error: str | None
    waited_s: float


@dataclass(frozen=True)
class MonitorFigures:
    """What ``retry_monitor`` reads from the store (:meth:`Readings.monitor_reading`)."""

    now: datetime
    oldest_overdue: Overdue | None
    lateness: Lateness
    dead_by_destination: dict[str, int]
    deliveries: tuple[Delivery, ...]
    waiting: ChainsWaiting
    #: The longest-waiting stuck chains (at most five), as ``chains list --stuck`` shows them.
    stuck_chain_ids: tuple[str, ...]
    #: The destinations' breakers not closed or still holding jobs (``BREAKERS``).
    breakers: tuple[BreakerStatus, ...]
    stuck_delivery: StuckDelivery | None


def _seconds(value: Any) -> float | None:
    return None if value is None else float(value)


def _overdue(row: Sequence[Any] | None) -> Overdue | None:
    return None if row is None else Overdue(row[0], row[1], row[2], float(row[3]))


class Readings:
    """Status, gauges and monitor figures read through the store's connection ``conn``."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def counts(self, destination: str | None = None, *, key_like: bytes | None = None) -> dict[str, int]:
        """Jobs by status (of ``destination``; of the keys matching the ``LIKE`` pattern ``key_like``):
        what ``status``, the benchmark and the demo count."""
        params = {"destination": destination, "key_like": key_like}
        with joined(self.conn):
            rows = self.conn.execute(q("status_counts"), params).fetchall()
        return {str(status): int(n) for status, n in rows}

    def dead_by_reason(
        self, destination: str | None = None, *, key_like: bytes | None = None
    ) -> dict[str, int]:
        """Dead jobs by reason (of ``destination``; of the keys matching ``key_like``): what ``status``
        and the demo show."""
        params = {"destination": destination, "key_like": key_like}
        with joined(self.conn):
            rows = self.conn.execute(q("dead_by_reason"), params).fetchall()
        return {str(reason): int(n) for reason, n in rows}

    def status(self, destination: str | None = None, window_s: int = 300) -> StatusReading:
        """Counts by status, the pending jobs waiting in a chain (ordered mode), dead jobs by reason, the oldest overdue
        job and recent lateness."""
        params = {"destination": destination, "window_s": window_s}
        with self.conn.transaction():
            counts = self.counts(destination)
            dead = self.dead_by_reason(destination)
            waiting = self.conn.execute(q("waiting_count"), {**params, "held_due": HELD_DUE_AT}).fetchone()
            overdue = self.conn.execute(q("oldest_overdue"), params).fetchone()
            late = self.lateness(window_s, destination)
            vacuum = self.conn.execute(q("vacuum_state")).fetchone()
        assert vacuum is not None
        return StatusReading(
            counts=counts,
            waiting=ChainsWaiting.from_row(waiting),
            dead_by_reason=dead,
            oldest_overdue=_overdue(overdue),
            lateness=late,
            vacuum=VacuumState(bool(vacuum[0]), int(vacuum[1]), int(vacuum[2]), vacuum[3]),
        )

    def chains_waiting(self) -> ChainsWaiting:
        """Ordered mode's records waiting in chains (the gauges' figures)."""
        with self.conn.transaction():
            row = self.conn.execute(
                q("waiting_count"), {"destination": None, "held_due": HELD_DUE_AT}
            ).fetchone()
        return ChainsWaiting.from_row(row)

    def lateness(self, window_s: int, destination: str | None = None) -> Lateness:
        """Publish lateness of the jobs published in the last ``window_s`` seconds (read through the
        ``published_at`` BRIN index, without parallel workers, whatever the table's statistics)."""
        with self.conn.transaction():
            plan = self.conn.execute(q("lateness_plan")).fetchone()
            assert plan is not None
            late = self.conn.execute(
                q("lateness"), {"destination": destination, "window_s": window_s}
            ).fetchone()
            self.conn.execute(q("lateness_plan_reset"), {"seqscan": plan[0], "workers": plan[1]})
        assert late is not None
        return Lateness(int(late[0]), late[1], late[2], late[3], int(late[4]))

    def metrics_reading(self, window_s: int = 10) -> Gauges:
        """The publish loop's gauges, lateness over the last ``window_s``."""
        params = {"destination": None, "window_s": window_s}
        with self.conn.transaction():
            backlog = self.conn.execute(q("backlog_due")).fetchone()
            overdue = self.conn.execute(q("oldest_overdue"), params).fetchone()
            late = self.lateness(window_s)
        assert backlog is not None
        return Gauges(
            backlog_due=int(backlog[0]),
            oldest_overdue_s=0.0 if overdue is None else max(0.0, float(overdue[3])),
            lateness_p50_s=late.p50_s,
            lateness_p99_s=late.p99_s,
        )

    def share_letters(self, topics: Sequence[str], window_s: int) -> list[tuple[str, float, int]]:
        """Per source topic, the letters of share groups' dead-letter ``topics`` stored in the last
        ``window_s``: the largest age (s) their source record had when read, and how many were kept
        without it (retry_monitor's ``letters_near_retention`` and ``letters_unreadable``)."""
        if not topics:
            return []
        rows = self.conn.execute(
            q("monitor_share_letters"), {"topics": list(topics), "window_s": window_s}
        ).fetchall()
        return [(str(topic), float(age), int(lost)) for topic, age, lost in rows]

    def adopted_recent(self, topics: Sequence[str], window_s: int) -> dict[str, int]:
        """Letters read from the adopted ``topics`` in the last ``window_s``, per topic."""
        if not topics:
            return {}
        rows = self.conn.execute(
            q("monitor_adopted_recent"), {"topics": list(topics), "window_s": window_s}
        ).fetchall()
        return {str(topic): int(count) for topic, count in rows}

    def monitor_reading(
        self, window_s: int, dead_window_s: int = 3600, *, dlq_grace_s: int = 60, repeated_failures: int = 5
    ) -> MonitorFigures:
        """What retry_monitor checks: the oldest overdue job, lateness over ``window_s``, recent dead jobs,
        and the deliveries that do not go through (dead jobs off their DLQ topic ``dlq_grace_s`` after
        they died, jobs whose last ``repeated_failures`` deliveries failed), per topic.

        Unlike ``status`` it counts nothing over the whole table: each figure comes from a partial index.
        """
        params = {"destination": None, "window_s": window_s}
        with self.conn.transaction():
            now = self.conn.execute(q("monitor_now")).fetchone()
            overdue = self.conn.execute(q("oldest_overdue"), params).fetchone()
            late = self.lateness(window_s)
            dead = self.conn.execute(q("monitor_dead_recent"), {"window_s": dead_window_s}).fetchall()
            stuck = self.conn.execute(q("monitor_stuck_delivery")).fetchone()
            deliveries = self.conn.execute(
                q("monitor_deliveries"), {"grace_s": dlq_grace_s, "failures": repeated_failures}
            ).fetchall()
            waiting = ChainsWaiting.from_row(
                self.conn.execute(
                    q("waiting_count"), {"destination": None, "held_due": HELD_DUE_AT}
                ).fetchone()
            )
            stuck_ids = (  # the longest waiting, as `chains list --stuck` shows them
                self.conn.execute(
                    q("waiting_chains"), {"held_due": HELD_DUE_AT, "chains": None, "stuck": True, "limit": 5}
                ).fetchall()
                if waiting.stuck
                else []
            )
            breakers = breaker_statuses(self.conn)
        assert now is not None
        return MonitorFigures(
            now=now[0],
            oldest_overdue=_overdue(overdue),
            lateness=late,
            dead_by_destination={str(row[0]): int(row[1]) for row in dead},
            deliveries=tuple(Delivery(str(r[0]), int(r[1]), int(r[2]), r[3]) for r in deliveries),
            waiting=waiting,
            stuck_chain_ids=tuple(str(row[0]) for row in stuck_ids),
            breakers=tuple(breakers),
            stuck_delivery=None
            if stuck is None
            else StuckDelivery(stuck[0], stuck[1], int(stuck[2] or 0), stuck[3], float(stuck[4] or 0.0)),
        )

    def lock_alerts(self, checks: Sequence[str]) -> dict[str, Incident]:
        """Lock the incident rows of ``checks`` (created on first use) until the caller's transaction ends.

        Returns each check's :class:`Incident`. The caller holds the transaction
        (``with store.conn.transaction():``): the row locks are what keep overlapping monitor runs from
        announcing one incident twice.
        """
        require_transaction(self.conn, "lock_alerts")
        with self.conn.transaction():
            self.conn.execute(q("alert_ensure"), {"checks": list(checks)})
            rows = self.conn.execute(q("alert_lock"), {"checks": list(checks)}).fetchall()
        return {row[0]: Incident(bool(row[1]), row[2], bool(row[3])) for row in rows}

    def save_alerts(self, states: Sequence[dict[str, Any]]) -> None:
        """Record each check's state: the parameters of the ``alert_update`` query, one dict per check."""
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.executemany(q("alert_update"), states)
