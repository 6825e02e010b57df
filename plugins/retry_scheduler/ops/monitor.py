"""retry_monitor: backlog, lateness, DLQ-growth and delivery checks that alert once per incident.

Ten checks, each against a threshold (:class:`~retry_scheduler.ops.thresholds.Thresholds`, overridden by the Airflow Variable
``retry_monitor_thresholds``; ``null`` turns a check off):

* ``oldest_overdue``: how long the oldest pending job has been past its due time, in seconds
  (publishing stalled or behind);
* ``lateness_p99``: p99 publish lateness (acknowledged minus due) of the jobs published in the last
  ``interval_s`` seconds; no publication in the interval: nothing to judge, not crossed;
* ``dead_per_hour``: jobs that went dead in the last hour and are still dead;
* ``stuck_delivery``: how long the delivery that has waited longest has been waiting, in seconds: a
  pending job whose deliveries fail (since its due time), or a dead job not yet on its DLQ topic
  (since it died); the alert names the job, the topic and the broker's last error (a record larger
  than the topic's ``max.message.bytes``, a topic that does not exist, missing rights);
* ``consumer_lag``: records on the retry topics not ingested yet (the broker's high watermarks
  minus where ingestion stands), per topic; the broker out of reach: nothing to judge;
* ``undelivered_dead``: dead jobs not yet on their DLQ topic ``DLQ_GRACE_S`` after they died;
* ``failing_deliveries``: pending jobs whose last ``REPEATED_FAILURES`` deliveries (or more) to
  their destination all failed.

* ``stuck_chains``: how long the oldest record waiting in a *stuck* chain has waited, in seconds (ordered
  mode: a chain waiting for a head the scheduler no longer has: its retry published and not released
  by its consumer, or lost); the alert names the chains and how to release them.
* ``letters_unreadable``: letters of share groups' dead-letter topics stored in the last hour without
  their record, which could not be read from its topic (gone by retention, say);
* ``letters_near_retention``: the largest share of its topic's ``retention.ms`` the source record of a
  share group's letter had used when it was read, over the last hour: a pointer-only letter read
  late is read before its record is deleted only by luck (the broker out of reach, or telling no
  retention: nothing to judge).

The ``undelivered_dead`` and ``failing_deliveries`` checks tell early (a minute, half a minute) that a DLQ topic or a destination refuses records;
``stuck_delivery`` is the escalation that names the job still waiting after ten minutes.

A check is crossed when its value is above its threshold. Its incident state lives in
``retry_alerts``, one row per check: a new incident sends one ``firing`` alert, a crossed check
whose incident was announced sends nothing, and a check back under sends one ``resolved`` alert.

Delivery is at-least-once. A run locks the rows (``SELECT ... FOR UPDATE``), reads the figures,
sends, and only then records what it sent and commits, in one transaction: an overlapping run
waits on the locks and then sees the incident as announced, while a crash between sending and
committing makes the next run announce the incident again (a duplicate, never a lost alert). An
incident counts as announced once a channel that reaches a person (webhook or e-mail) took it, or
the log when neither is configured; while every configured such channel fails, each run tries
again. An incident that ends before anyone was told ends silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from retry_scheduler.db.readings import Incident
from retry_scheduler.db.store import Store
from retry_scheduler.loops.sources import LetterReading
from retry_scheduler.ops.alerts import Alert, Channel
from retry_scheduler.ops.checks import BY_NAME, CHECKS, DLQ_GRACE_S, REPEATED_FAILURES, Reading, describe
from retry_scheduler.ops.thresholds import VARIABLE, Thresholds, ThresholdsError

if TYPE_CHECKING:
    from retry_scheduler.loops.offsets import IngestLag

log = logging.getLogger(__name__)
T = TypeVar("T")

_DEAD_WINDOW_S = 3600


#: ok: under, nothing going on; new: an incident starts; ongoing: still crossed, already announced;
#: retry: still crossed, not yet announced; resolved: back under after an announced incident;
#: dropped: back under before the incident was announced (ends silently).
Transition = Literal["ok", "new", "ongoing", "retry", "resolved", "dropped"]


@dataclass(frozen=True)
class CheckOutcome:
    """What one check decided in one run: the alert to send, if any, and the state to record."""

    check: str
    transition: Transition
    value: float | None
    threshold: float | None
    message: str
    since: datetime | None
    alert: Alert | None = None

    def record(self, delivered: bool) -> dict[str, Any]:
        """The ``alert_update`` parameters, given whether the alert (if any) was announced."""
        firing = self.transition in ("new", "ongoing", "retry") or (
            self.transition == "resolved" and not delivered  # keep it firing: the next run tells again
        )
        return {
            "check": self.check,
            "firing": firing,
            "since": self.since,
            "value": self.value,
            "threshold": self.threshold,
            "message": self.message,
            "notified": self.alert is not None and delivered,
            "resolved": not firing and self.transition in ("resolved", "dropped"),
        }


def evaluate(
    reading: Reading, thresholds: Thresholds, incidents: Mapping[str, Incident]
) -> list[CheckOutcome]:
    """Decide, for each check, whether to alert: pure, no I/O.

    A new incident gives one ``firing`` alert; a crossed check already announced gives none; a
    check back under after an announced incident gives one ``resolved`` alert.
    """
    outcomes = []
    for check in CHECKS:
        threshold = getattr(thresholds, BY_NAME[check].threshold)
        value = reading.value(check)
        state = incidents.get(check, Incident())
        crossed = threshold is not None and value is not None and value > threshold
        head, detail, extra = describe(check, reading, threshold)
        transition: Transition
        since: datetime | None
        if crossed:
            transition = "ongoing" if state.firing and state.announced else "retry" if state.firing else "new"
            since = state.since if state.firing and state.since is not None else reading.at
        else:
            transition = (
                "resolved" if state.firing and state.announced else "dropped" if state.firing else "ok"
            )
            since = state.since
        alert = None
        fields = {"check": check, "value": value, "threshold": threshold, "since": _iso(since), **extra}
        if transition in ("new", "retry"):
            alert = Alert(title=f"retry_monitor: {head}", text=detail, severity="firing", fields=fields)
        elif transition == "resolved":
            alert = Alert(
                title=f"retry_monitor: {check} back to normal: {head}",
                text=f"The incident that started at {_iso(since)} is over. {detail}",
                severity="resolved",
                fields=fields,
            )
        outcomes.append(CheckOutcome(check, transition, value, threshold, f"{head}. {detail}", since, alert))
    return outcomes


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def announced(results: Sequence[tuple[Channel, bool | None]]) -> bool:
    """Whether an alert reached someone: a person-facing channel took it, or none is configured and
    the log did. ``results`` pairs each notifier with what its ``send`` returned."""
    people = [result for notifier, result in results if notifier.reaches_people]
    if any(result is True for result in people):
        return True
    if any(result is False for result in people):
        return False
    return any(result is True for _, result in results)


def run_monitor(
    database_url: str,
    thresholds: Thresholds,
    notifiers: Sequence[Channel],
    lag: Callable[[Store], IngestLag] | None = None,
    letters: Callable[[Store], LetterReading] | None = None,
) -> dict[str, Any]:
    """One monitor run: lock, read, evaluate, send, record, commit. Returns the reading and alerts sent.

    ``lag`` asks the broker how far ingestion is behind (``loops.offsets.ingest_lag``); without it, or
    when it fails (logged), ``consumer_lag`` has nothing to judge. ``letters`` reads the share groups'
    letters of the last hour (``loops.sources.read_letters``); without it they are not judged.
    """
    sent: list[dict[str, Any]] = []
    with Store(database_url) as store:
        behind, lag_error = _ask(lag, store, "the retry topics' lag")
        shared, letters_error = _ask(letters, store, "the share groups' dead letters")
        with store.conn.transaction():  # one connection: the broker is asked before the rows are locked
            incidents = store.readings.lock_alerts(CHECKS)
            raw = store.readings.monitor_reading(
                thresholds.interval_s,
                _DEAD_WINDOW_S,
                dlq_grace_s=DLQ_GRACE_S,
                repeated_failures=REPEATED_FAILURES,
            )
            reading = Reading.from_store(raw, thresholds.interval_s, behind, lag_error, shared, letters_error)
            outcomes = evaluate(reading, thresholds, incidents)
            states = []
            for outcome in outcomes:
                delivered = False
                if outcome.alert is not None:
                    results = [(notifier, notifier.send(outcome.alert)) for notifier in notifiers]
                    delivered = announced(results)
                    sent.append(
                        {
                            "check": outcome.check,
                            "severity": outcome.alert.severity,
                            "title": outcome.alert.headline,
                            "delivered": delivered,
                            "channels": {n.kind: r for n, r in results},
                        }
                    )
                states.append(outcome.record(delivered))
            store.readings.save_alerts(states)
    firing = sorted(s["check"] for s in states if s["firing"])
    log.info(
        "monitor run: oldest overdue %.3fs, lateness p99 %s over %ss (%s published), %s dead in the last hour, "
        "longest waiting delivery %.1fs, %s records not ingested, %s dead jobs off their DLQ topic, "
        "%s jobs failing deliveries; firing: %s; alerts sent: %s",
        reading.oldest_overdue_s,
        "-" if reading.lateness_p99_s is None else f"{reading.lateness_p99_s:.4f}s",
        reading.interval_s,
        reading.published,
        reading.dead_last_hour,
        reading.stuck_delivery_s,
        "?" if reading.consumer_lag is None else reading.consumer_lag,
        reading.undelivered_dead,
        reading.failing_deliveries,
        ", ".join(firing) or "none",
        ", ".join(f"{a['check']} {a['severity']}" for a in sent) or "none",
    )
    return {"reading": reading.as_dict(), "thresholds": asdict(thresholds), "firing": firing, "alerts": sent}


def _ask(reader: Callable[[Store], T] | None, store: Store, what: str) -> tuple[T | None, str | None]:
    """What ``reader`` (the retry topics' lag, the share groups' letters) answers, asked before the
    alert rows are locked (it may take the broker's timeout); the error instead when it fails."""
    if reader is None:
        return None, None
    try:
        return reader(store), None
    except Exception as exc:  # the broker out of reach: the other checks still run
        log.warning("cannot read %s: %s: %s", what, type(exc).__name__, exc)
        return None, f"{type(exc).__name__}: {exc}"


__all__ = [
    "CHECKS",
    "VARIABLE",
    "CheckOutcome",
    "Incident",
    "Reading",
    "Thresholds",
    "ThresholdsError",
    "announced",
    "evaluate",
    "run_monitor",
]
