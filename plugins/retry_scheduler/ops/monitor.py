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

* ``stuck_chains``: how long the oldest record held in a *stuck* chain has waited, in seconds (ordered
  mode: a chain waiting for a head the scheduler does not hold: its retry published and not released
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
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from retry_scheduler.db.store import Store
from retry_scheduler.loops.sources import LetterReading
from retry_scheduler.ops.alerts import Alert
from retry_scheduler.ops.thresholds import VARIABLE, Thresholds, ThresholdsError

if TYPE_CHECKING:
    from retry_scheduler.airflow.notifiers import AlertNotifier
    from retry_scheduler.loops.offsets import IngestLag

log = logging.getLogger(__name__)

_DEAD_WINDOW_S = 3600
#: A dead job is sent to its DLQ topic in the publish loop's next round: one still off it a minute
#: after it died is one the topic refuses (``undelivered_dead``).
DLQ_GRACE_S = 60
#: Failed deliveries in a row that make a job's delivery "failing repeatedly" (the backoff between them
#: doubles from 1 s: five take about half a minute).
REPEATED_FAILURES = 5


@dataclass(frozen=True)
class Reading:
    """The figures of one monitor run."""

    at: datetime
    #: Seconds the oldest pending job is past its due time; 0 when none is overdue.
    oldest_overdue_s: float = 0.0
    oldest_overdue_job: int | None = None
    oldest_overdue_destination: str | None = None
    #: p99 publish lateness over the interval; None when nothing was published in it.
    lateness_p99_s: float | None = None
    published: int = 0
    interval_s: int = 300
    #: Jobs that went dead in the last hour (still dead), per destination.
    dead_by_destination: Mapping[str, int] = field(default_factory=dict)
    #: The delivery waiting longest (failing, or a dead job not on its DLQ topic): seconds, job, topic,
    #: failed attempts, the broker's last error; 0 and None when none waits.
    stuck_delivery_s: float = 0.0
    stuck_job: int | None = None
    stuck_topic: str | None = None
    stuck_failures: int = 0
    stuck_error: str | None = None
    #: Records on the retry topics not ingested yet, per topic; None when the broker could not be asked.
    consumer_lag: int | None = None
    lag_by_topic: Mapping[str, int] = field(default_factory=dict)
    lag_error: str | None = None
    #: Per topic: dead jobs off their DLQ topic past the grace, jobs failing repeatedly, the last error.
    deliveries: Sequence[Mapping[str, Any]] = ()
    #: Ordered mode: records held, in how many chains; the chains stuck (their head not at the
    #: scheduler), the oldest of their records' wait (0 when none), and the longest waiting of them.
    held: int = 0
    held_chains: int = 0
    stuck_chains: int = 0
    oldest_stuck_s: float = 0.0
    stuck_chain_ids: Sequence[str] = ()
    #: Share groups' letters of the last hour (:class:`~retry_scheduler.loops.sources.LetterReading`).
    letters: LetterReading = field(default_factory=lambda: LetterReading())
    letters_error: str | None = None

    @property
    def undelivered_dead(self) -> int:
        return sum(int(d["undelivered_dead"]) for d in self.deliveries)

    @property
    def failing_deliveries(self) -> int:
        return sum(int(d["failing"]) for d in self.deliveries)

    @property
    def dead_last_hour(self) -> int:
        return sum(self.dead_by_destination.values())

    @classmethod
    def from_store(
        cls,
        raw: Mapping[str, Any],
        interval_s: int,
        lag: IngestLag | None = None,
        lag_error: str | None = None,
        letters: LetterReading | None = None,
        letters_error: str | None = None,
    ) -> Reading:
        overdue = raw["oldest_overdue"] or {}
        late = raw["lateness"]
        return cls(
            at=raw["now"],
            oldest_overdue_s=max(0.0, float(overdue.get("overdue_s") or 0.0)),
            oldest_overdue_job=overdue.get("id"),
            oldest_overdue_destination=overdue.get("destination"),
            lateness_p99_s=late.p99_s,
            published=late.count,
            interval_s=interval_s,
            dead_by_destination=dict(raw["dead_by_destination"]),
            **_stuck(raw.get("stuck_delivery")),
            consumer_lag=None if lag is None else lag.total,
            lag_by_topic={} if lag is None else dict(lag.by_topic),
            lag_error=lag_error,
            deliveries=tuple(raw.get("deliveries") or ()),
            held=int(raw.get("held") or 0),
            held_chains=int(raw.get("held_chains") or 0),
            stuck_chains=int(raw.get("stuck_chains") or 0),
            oldest_stuck_s=float(raw.get("oldest_stuck_s") or 0.0),
            stuck_chain_ids=tuple(raw.get("stuck_chain_ids") or ()),
            letters=letters or LetterReading(),
            letters_error=letters_error,
        )

    def value(self, check: str) -> float | None:
        """The figure of ``check`` (a name of :data:`CHECKS`) in this reading."""
        return _BY_NAME[check].value(self)

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "oldest_overdue_s": round(self.oldest_overdue_s, 3),
            "oldest_overdue_job": self.oldest_overdue_job,
            "oldest_overdue_destination": self.oldest_overdue_destination,
            "lateness_p99_s": None if self.lateness_p99_s is None else round(self.lateness_p99_s, 4),
            "published": self.published,
            "interval_s": self.interval_s,
            "dead_last_hour": self.dead_last_hour,
            "dead_by_destination": dict(self.dead_by_destination),
            "stuck_delivery_s": round(self.stuck_delivery_s, 3),
            "stuck_job": self.stuck_job,
            "stuck_topic": self.stuck_topic,
            "stuck_failures": self.stuck_failures,
            "stuck_error": self.stuck_error,
            "consumer_lag": self.consumer_lag,
            "lag_by_topic": dict(self.lag_by_topic),
            "lag_error": self.lag_error,
            "undelivered_dead": self.undelivered_dead,
            "failing_deliveries": self.failing_deliveries,
            "deliveries": [dict(d) for d in self.deliveries],
            "held": self.held,
            "held_chains": self.held_chains,
            "stuck_chains": self.stuck_chains,
            "oldest_stuck_s": round(self.oldest_stuck_s, 3),
            "stuck_chain_ids": list(self.stuck_chain_ids),
            "letters_unreadable": self.letters.unreadable,
            "letter_retention_share": None
            if self.letters.retention_share is None
            else round(self.letters.retention_share, 4),
            "letter_topic": self.letters.topic,
            "letter_age_s": round(self.letters.age_s, 3),
            "letter_retention_ms": self.letters.retention_ms,
            "letters_error": self.letters_error,
            "letters_by_writer": dict(self.letters.by_writer),
        }


def _stuck(raw: Mapping[str, Any] | None) -> dict[str, Any]:
    if not raw:
        return {}
    return {
        "stuck_delivery_s": max(0.0, float(raw.get("waited_s") or 0.0)),
        "stuck_job": raw.get("id"),
        "stuck_topic": raw.get("target"),
        "stuck_failures": int(raw.get("failures") or 0),
        "stuck_error": raw.get("error"),
    }


@dataclass(frozen=True)
class Incident:
    """A check's state as stored in ``retry_alerts``."""

    firing: bool = False
    since: datetime | None = None
    #: A notification went out after the incident started.
    announced: bool = False


#: ok: under, nothing going on; new: an incident starts; ongoing: still crossed, already announced;
#: retry: still crossed, not yet announced; resolved: back under after an announced incident;
#: dropped: back under before the incident was announced (ends silently).
Transition = Literal["ok", "new", "ongoing", "retry", "resolved", "dropped"]


@dataclass(frozen=True)
class Outcome:
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


def _secs(value: float) -> str:
    return f"{value:.1f} s" if abs(value) >= 10 else f"{value:.3f} s"


def _num(value: float) -> str:
    return f"{value:g}"


#: What a check's description returns: a headline (the figure and its threshold), a sentence of
#: detail, and the structured fields of its alert.
Described = tuple[str, str, dict[str, Any]]


def _oldest_overdue(reading: Reading, limit: str) -> Described:
    head = f"oldest overdue job is {_secs(reading.oldest_overdue_s)} late ({limit})"
    detail = (
        f"Job {reading.oldest_overdue_job} for {reading.oldest_overdue_destination} is "
        f"{_secs(reading.oldest_overdue_s)} past its due time: publishing is stalled or behind; "
        "check the retry_scheduler DAG's publish task."
        if reading.oldest_overdue_job is not None
        else "No pending job is overdue."
    )
    return (
        head,
        detail,
        {"job_id": reading.oldest_overdue_job, "destination": reading.oldest_overdue_destination},
    )


def _lateness_p99(reading: Reading, limit: str) -> Described:
    p99 = "n/a" if reading.lateness_p99_s is None else _secs(reading.lateness_p99_s)
    head = f"publish lateness p99 is {p99} over the last {reading.interval_s} s ({limit})"
    detail = (
        f"{reading.published} jobs were published in the last {reading.interval_s} s; the slowest 1% "
        f"reached their destination {p99} or more after their due time."
    )
    return head, detail, {"interval_s": reading.interval_s, "published": reading.published}


def _dead_per_hour(reading: Reading, limit: str) -> Described:
    top = sorted(reading.dead_by_destination.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    head = f"{reading.dead_last_hour} jobs went dead in the last hour ({limit})"
    detail = (
        "Dead jobs by destination: " + ", ".join(f"{d} {n}" for d, n in top) + "."
        if top
        else "No job went dead in the last hour."
    ) + " Browse them with `retry-scheduler dlq list`."
    return head, detail, {"by_destination": dict(top)}


def _stuck_delivery(reading: Reading, limit: str) -> Described:
    head = f"a delivery has been waiting {_secs(reading.stuck_delivery_s)} ({limit})"
    if reading.stuck_job is None:
        detail = "Every delivery goes through."
    else:
        error = (reading.stuck_error or "no error recorded yet: is the publish loop running?")[:300]
        detail = (
            f"Job {reading.stuck_job} has not reached {reading.stuck_topic} after "
            f"{reading.stuck_failures} failed attempts; the last error: {error}. Fix the topic "
            "(its existence, max.message.bytes, the service's rights) or the record, then watch it "
            "go out with `retry-scheduler dlq show`."
        )
    extra = {
        "job_id": reading.stuck_job,
        "topic": reading.stuck_topic,
        "failures": reading.stuck_failures,
        "error": reading.stuck_error,
    }
    return head, detail, extra


def _consumer_lag(reading: Reading, limit: str) -> Described:
    lag = "an unknown number of" if reading.consumer_lag is None else str(reading.consumer_lag)
    head = f"{lag} records on the retry topics are not ingested yet ({limit})"
    top = sorted(reading.lag_by_topic.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    if reading.consumer_lag is None:
        detail = f"The broker could not be asked: {(reading.lag_error or 'no reader')[:300]}."
    else:
        detail = (
            "Behind, by topic: " + ", ".join(f"{t} {n}" for t, n in top) + ". Is the retry_scheduler DAG's "
            "ingest task running, and keeping up (its log's per-batch figures)?"
            if reading.consumer_lag
            else "Ingestion is up to date."
        )
    return head, detail, {"by_topic": dict(top), "error": reading.lag_error}


def _deliveries(key: str, head: str, reading: Reading) -> Described:
    """``undelivered_dead`` and ``failing_deliveries``: the topics with some, and their last errors."""
    rows = [d for d in reading.deliveries if d[key]][:5]
    detail = (
        "By topic: "
        + "; ".join(
            f"{d['topic']} {d[key]} (last error: {(d['error'] or 'none recorded')[:200]})" for d in rows
        )
        + ". Fix the topic (its existence, max.message.bytes, the service's rights) or the records; "
        "the publish loop keeps trying, and `retry-scheduler dlq show` shows a job's last error."
        if rows
        else "Every delivery goes through."
    )
    return head, detail, {"by_topic": {d["topic"]: d[key] for d in rows}}


def _undelivered_dead(reading: Reading, limit: str) -> Described:
    head = f"{reading.undelivered_dead} dead jobs are not on their DLQ topic {DLQ_GRACE_S} s after they died ({limit})"
    return _deliveries("undelivered_dead", head, reading)


def _failing_deliveries(reading: Reading, limit: str) -> Described:
    head = (
        f"{reading.failing_deliveries} jobs failed {REPEATED_FAILURES} or more deliveries to their "
        f"destination in a row ({limit})"
    )
    return _deliveries("failing", head, reading)


def _stuck_chains(reading: Reading, limit: str) -> Described:
    head = (
        f"{reading.stuck_chains} held chain(s) wait for a head the scheduler does not hold, the oldest "
        f"record for {_secs(reading.oldest_stuck_s)} ({limit})"
    )
    detail = (
        "Ordered mode: records of these keys wait behind a failed record whose retry was published and "
        "not released by its consumer group (is it running, reading that topic?), or whose head is lost. "
        f"The longest waiting: {', '.join(reading.stuck_chain_ids[:5])}. See them with "
        "`retry-scheduler chains list --stuck`; `retry-scheduler chains release CHAIN --yes` lets one go "
        "as if its head had died."
        if reading.stuck_chains
        else "No held chain is stuck."
    )
    return head, detail, {"chains": list(reading.stuck_chain_ids[:5]), "held": reading.held}


def _letters_unreadable(reading: Reading, limit: str) -> Described:
    lost = reading.letters.unreadable
    head = f"{lost} share-group dead letter(s) of the last hour kept without their record ({limit})"
    detail = (
        "These letters only pointed at their record (the share group has no "
        "errors.deadletterqueue.copy.record.enable) and it could no longer be read from its topic: "
        "each is kept dead without a destination, its reason saying why (`retry-scheduler dlq list "
        "--dead-reason adopted`). Set errors.deadletterqueue.copy.record.enable=true on the group, or "
        "keep the source topic's records longer."
        if lost
        else "Every share-group letter of the last hour holds its record."
    )
    return head, detail, {"unreadable": lost}


def _letters_near_retention(reading: Reading, limit: str) -> Described:
    letters = reading.letters
    if letters.retention_share is None:
        why = reading.letters_error or "no pointer-only share-group letter read, or no retention known"
        return f"no share-group letter's record age to judge ({limit})", why, {}
    head = (
        f"a share-group letter's record was {letters.retention_share:.0%} of its topic's retention old "
        f"when read ({limit})"
    )
    detail = (
        f"The record of a letter pointing to {letters.topic} was {_secs(letters.age_s)} old when the "
        f"ingest read it, and {letters.topic} keeps records for {_secs((letters.retention_ms or 0) / 1000)} "
        "(retention.ms). A letter read later than that keeps no record. Set "
        "errors.deadletterqueue.copy.record.enable=true on the share group, keep the topic's records "
        "longer, or look for what delays the ingest of its dead-letter topic (consumer_lag)."
    )
    return (
        head,
        detail,
        {"topic": letters.topic, "age_s": round(letters.age_s, 3), "retention_ms": letters.retention_ms},
    )


def _maybe(value: int | None) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class Check:
    """One check of retry_monitor: its figure in a reading, its threshold (a field of
    :class:`~retry_scheduler.ops.thresholds.Thresholds`), and how its alert reads."""

    name: str
    #: The :class:`Thresholds` field that holds when it fires (above).
    threshold: str
    value: Callable[[Reading], float | None]
    describe: Callable[[Reading, str], Described]
    #: Whether the figure counts things (else it is a duration in seconds).
    counts: bool = False


#: Every check, in the order they are evaluated and reported.
REGISTRY: tuple[Check, ...] = (
    Check("oldest_overdue", "oldest_overdue_s", lambda r: r.oldest_overdue_s, _oldest_overdue),
    Check("lateness_p99", "lateness_p99_s", lambda r: r.lateness_p99_s, _lateness_p99),
    Check("dead_per_hour", "dead_per_hour", lambda r: float(r.dead_last_hour), _dead_per_hour, counts=True),
    Check("stuck_delivery", "stuck_delivery_s", lambda r: r.stuck_delivery_s, _stuck_delivery),
    Check(
        "consumer_lag",
        "consumer_lag",
        lambda r: _maybe(r.consumer_lag),
        _consumer_lag,
        counts=True,
    ),
    Check(
        "undelivered_dead",
        "undelivered_dead",
        lambda r: float(r.undelivered_dead),
        _undelivered_dead,
        counts=True,
    ),
    Check(
        "failing_deliveries",
        "failing_deliveries",
        lambda r: float(r.failing_deliveries),
        _failing_deliveries,
        counts=True,
    ),
    Check("stuck_chains", "stuck_chain_s", lambda r: r.oldest_stuck_s, _stuck_chains),
    Check(
        "letters_unreadable",
        "letters_unreadable",
        lambda r: float(r.letters.unreadable),
        _letters_unreadable,
        counts=True,
    ),
    Check(
        "letters_near_retention",
        "letter_retention_share",
        lambda r: r.letters.retention_share,
        _letters_near_retention,
        counts=True,
    ),
)
_BY_NAME = {check.name: check for check in REGISTRY}
CHECKS = tuple(check.name for check in REGISTRY)


def _describe(check: str, reading: Reading, threshold: float | None) -> Described:
    """A headline (the figure and its threshold), a sentence of detail, and the structured fields."""
    unit = "" if _BY_NAME[check].counts else " s"
    limit = "check off" if threshold is None else f"threshold {_num(threshold)}{unit}"
    return _BY_NAME[check].describe(reading, limit)


def evaluate(reading: Reading, thresholds: Thresholds, incidents: Mapping[str, Incident]) -> list[Outcome]:
    """Decide, for each check, whether to alert: pure, no I/O.

    A new incident gives one ``firing`` alert; a crossed check already announced gives none; a
    check back under after an announced incident gives one ``resolved`` alert.
    """
    outcomes = []
    for check in CHECKS:
        threshold = getattr(thresholds, _BY_NAME[check].threshold)
        value = reading.value(check)
        state = incidents.get(check, Incident())
        crossed = threshold is not None and value is not None and value > threshold
        head, detail, extra = _describe(check, reading, threshold)
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
        outcomes.append(Outcome(check, transition, value, threshold, f"{head}. {detail}", since, alert))
    return outcomes


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def announced(results: Sequence[tuple[AlertNotifier, bool | None]]) -> bool:
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
    notifiers: Sequence[AlertNotifier],
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
        behind, lag_error = _read_lag(lag, store)
        shared, letters_error = _read_letters(letters, store)
        with store.conn.transaction():  # one connection: the broker is asked before the rows are locked
            locked = store.lock_alerts(CHECKS)
            incidents = {
                check: Incident(firing, since, was_announced)
                for check, (firing, since, was_announced) in locked.items()
            }
            raw = store.monitor_reading(
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
            store.save_alerts(states)
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


def _read_letters(
    letters: Callable[[Store], LetterReading] | None, store: Store
) -> tuple[LetterReading | None, str | None]:
    """The share groups' letters, before the alert rows are locked (the broker is asked their topics'
    retention)."""
    if letters is None:
        return None, None
    try:
        return letters(store), None
    except Exception as exc:  # the broker out of reach: the other checks still run
        log.warning("cannot read the share groups' dead letters: %s: %s", type(exc).__name__, exc)
        return None, f"{type(exc).__name__}: {exc}"


def _read_lag(lag: Callable[[Store], IngestLag] | None, store: Store) -> tuple[IngestLag | None, str | None]:
    """The broker's answer, before the alert rows are locked (it may take the broker's timeout)."""
    if lag is None:
        return None, None
    try:
        return lag(store), None
    except Exception as exc:  # the broker out of reach: the other checks still run
        log.warning("cannot read the retry topics' lag: %s: %s", type(exc).__name__, exc)
        return None, f"{type(exc).__name__}: {exc}"


__all__ = [
    "CHECKS",
    "VARIABLE",
    "Incident",
    "Outcome",
    "Reading",
    "Thresholds",
    "ThresholdsError",
    "announced",
    "evaluate",
    "run_monitor",
]
