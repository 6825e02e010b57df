"""retry_monitor's checks: what one run reads (:class:`Reading`), each check's figure and how its alert
reads (:data:`REGISTRY`); :mod:`retry_scheduler.ops.monitor` evaluates them and sends the alerts."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from retry_scheduler.loops.sources import LetterReading

if TYPE_CHECKING:
    from retry_scheduler.db.readings import Delivery, MonitorFigures
    from retry_scheduler.loops.offsets import IngestLag

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
    #: The largest share of its retry topic's ``retention.ms`` the oldest record not ingested has used,
    #: that topic, the record's age and the retention; None when nothing waits or no retention is known.
    lag_retention_share: float | None = None
    lag_retention_topic: str | None = None
    lag_oldest_s: float = 0.0
    lag_retention_ms: int | None = None
    #: Records removed from the retry topics (retention) before the ingest read them, per topic.
    removed_unread: Mapping[str, int] = field(default_factory=dict)
    #: Per topic: dead jobs off their DLQ topic past the grace, jobs failing repeatedly, the last error.
    deliveries: Sequence[Delivery] = ()
    #: Ordered mode: records waiting in a chain, in how many chains; the chains stuck (their head not at the
    #: scheduler), the oldest of their records' wait (0 when none), and the longest waiting of them.
    waiting: int = 0
    waiting_chains: int = 0
    stuck_chains: int = 0
    oldest_stuck_s: float = 0.0
    stuck_chain_ids: Sequence[str] = ()
    #: The destinations' breakers not closed or with jobs still paused (``BREAKERS``), as dicts.
    breakers: Sequence[Mapping[str, Any]] = ()
    #: Share groups' letters of the last hour (:class:`~retry_scheduler.loops.sources.LetterReading`).
    letters: LetterReading = field(default_factory=lambda: LetterReading())
    letters_error: str | None = None

    @property
    def undelivered_dead(self) -> int:
        return sum(d.undelivered_dead for d in self.deliveries)

    @property
    def failing_deliveries(self) -> int:
        return sum(d.failing for d in self.deliveries)

    @property
    def open_breakers(self) -> int:
        return sum(b["state"] != "closed" for b in self.breakers)

    @property
    def dead_last_hour(self) -> int:
        return sum(self.dead_by_destination.values())

    @classmethod
    def from_store(
        cls,
        figures: MonitorFigures,
        interval_s: int,
        lag: IngestLag | None = None,
        lag_error: str | None = None,
        letters: LetterReading | None = None,
        letters_error: str | None = None,
    ) -> Reading:
        overdue, late, stuck = figures.oldest_overdue, figures.lateness, figures.stuck_delivery
        nearest = None if lag is None else lag.retention_share()
        near_topic = None if nearest is None else nearest[1]
        return cls(
            at=figures.now,
            oldest_overdue_s=0.0 if overdue is None else max(0.0, overdue.overdue_s),
            oldest_overdue_job=None if overdue is None else overdue.id,
            oldest_overdue_destination=None if overdue is None else overdue.destination,
            lateness_p99_s=late.p99_s,
            published=late.count,
            interval_s=interval_s,
            dead_by_destination=dict(figures.dead_by_destination),
            stuck_delivery_s=0.0 if stuck is None else max(0.0, stuck.waited_s),
            stuck_job=None if stuck is None else stuck.id,
            stuck_topic=None if stuck is None else stuck.target,
            stuck_failures=0 if stuck is None else stuck.failures,
            stuck_error=None if stuck is None else stuck.error,
            consumer_lag=None if lag is None else lag.total,
            lag_by_topic={} if lag is None else dict(lag.by_topic),
            lag_error=lag_error,
            lag_retention_share=None if nearest is None else nearest[0],
            lag_retention_topic=near_topic,
            lag_oldest_s=0.0 if lag is None or near_topic is None else lag.oldest_unread_s[near_topic],
            lag_retention_ms=None if lag is None or near_topic is None else lag.retention_ms.get(near_topic),
            removed_unread={} if lag is None else dict(lag.removed_unread),
            deliveries=figures.deliveries,
            waiting=figures.waiting.waiting,
            waiting_chains=figures.waiting.chains,
            stuck_chains=figures.waiting.stuck,
            oldest_stuck_s=figures.waiting.oldest_stuck_s or 0.0,
            stuck_chain_ids=figures.stuck_chain_ids,
            breakers=tuple(b.as_dict() for b in figures.breakers),
            letters=letters or LetterReading(),
            letters_error=letters_error,
        )

    def value(self, check: str) -> float | None:
        """The figure of ``check`` (a name of :data:`CHECKS`) in this reading."""
        return BY_NAME[check].value(self)

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
            "lag_retention_share": None
            if self.lag_retention_share is None
            else round(self.lag_retention_share, 4),
            "lag_retention_topic": self.lag_retention_topic,
            "lag_oldest_s": round(self.lag_oldest_s, 3),
            "lag_retention_ms": self.lag_retention_ms,
            "removed_unread": dict(self.removed_unread),
            "undelivered_dead": self.undelivered_dead,
            "failing_deliveries": self.failing_deliveries,
            "deliveries": [d._asdict() for d in self.deliveries],
            "waiting": self.waiting,
            "waiting_chains": self.waiting_chains,
            "stuck_chains": self.stuck_chains,
            "oldest_stuck_s": round(self.oldest_stuck_s, 3),
            "stuck_chain_ids": list(self.stuck_chain_ids),
            "open_breakers": self.open_breakers,
            "breakers": [dict(b) for b in self.breakers],
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


def _lag_near_retention(reading: Reading, limit: str) -> Described:
    share = reading.lag_retention_share
    if share is None:
        why = reading.lag_error or "no record waits to be ingested, or its topic's retention is not known"
        return f"no retry-topic record waits near its retention ({limit})", why, {}
    topic, retention_s = reading.lag_retention_topic, (reading.lag_retention_ms or 0) / 1000
    head = f"the oldest record not ingested on {topic} is {share:.0%} of its retention old ({limit})"
    detail = (
        f"It was written {_secs(reading.lag_oldest_s)} ago and {topic} keeps records for "
        f"{_secs(retention_s)} (retention.ms): a retry the ingest has not read by then is removed unread, "
        "and lost. Is the retry_scheduler DAG's ingest task running and keeping up (consumer_lag)? Keep "
        "the topic's records longer meanwhile (kafka-configs --alter --entity-type topics --entity-name "
        f"{topic} --add-config retention.ms=...)."
    )
    extra = {
        "topic": topic,
        "oldest_s": round(reading.lag_oldest_s, 3),
        "retention_ms": reading.lag_retention_ms,
    }
    return head, detail, extra


def _removed_unread(reading: Reading, limit: str) -> Described:
    lost = sum(reading.removed_unread.values())
    head = f"{lost} records were removed from the retry topics before the ingest read them ({limit})"
    detail = (
        "Removed by the topics' retention while the ingest stood before them, by topic: "
        + ", ".join(f"{t} {n}" for t, n in sorted(reading.removed_unread.items()))
        + ". They are lost: their retries were never stored. Find what stopped the ingest "
        "(consumer_lag, the retry_scheduler DAG's runs) and keep the retry topics' records longer."
        if lost
        else (reading.lag_error or "Every record of the retry topics was read before its removal.")
    )
    return head, detail, {"by_topic": dict(reading.removed_unread)}


def _deliveries(key: str, head: str, reading: Reading) -> Described:
    """``undelivered_dead`` and ``failing_deliveries``: the topics with some, and their last errors."""
    rows = [d for d in reading.deliveries if getattr(d, key)][:5]
    detail = (
        "By topic: "
        + "; ".join(
            f"{d.topic} {getattr(d, key)} (last error: {(d.error or 'none recorded')[:200]})" for d in rows
        )
        + ". Fix the topic (its existence, max.message.bytes, the service's rights) or the records; "
        "the publish loop keeps trying, and `retry-scheduler dlq show` shows a job's last error."
        if rows
        else "Every delivery goes through."
    )
    return head, detail, {"by_topic": {d.topic: getattr(d, key) for d in rows}}


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
        f"{reading.stuck_chains} chain(s) wait for a head the scheduler no longer has, the oldest "
        f"record for {_secs(reading.oldest_stuck_s)} ({limit})"
    )
    detail = (
        "Ordered mode: records of these keys wait behind a failed record whose retry was published and "
        "not released by its consumer group (is it running, reading that topic?), or whose head is lost. "
        f"The longest waiting: {', '.join(reading.stuck_chain_ids[:5])}. See them with "
        "`retry-scheduler chains list --stuck`; `retry-scheduler chains release CHAIN --yes` lets one go "
        "as if its head had died."
        if reading.stuck_chains
        else "No chain is stuck."
    )
    return head, detail, {"chains": list(reading.stuck_chain_ids[:5]), "waiting": reading.waiting}


def _open_breakers(reading: Reading, limit: str) -> Described:
    opened = [b for b in reading.breakers if b["state"] != "closed"][:5]
    head = f"{reading.open_breakers} destination(s) paused by their breaker ({limit})"
    detail = (
        "Their records failed or came back past their breaker's share (BREAKERS in the policies module): "
        "their due jobs are paused, attempts unspent, until a probe record stays away. "
        + "; ".join(
            f"{b['destination']} {b['state']} since {b['since']}, {b['paused']} paused: {(b['reason'] or '')[:200]}"
            for b in opened
        )
        + ". Fix the consumer; `retry-scheduler breakers list` shows them, `retry-scheduler breakers close "
        "DESTINATION --yes` lets the paused jobs go at once."
        if opened
        else "Every breaker is closed."
    )
    return head, detail, {"breakers": {b["destination"]: b["state"] for b in opened}}


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
        "ingest_near_retention",
        "ingest_retention_share",
        lambda r: r.lag_retention_share,
        _lag_near_retention,
        counts=True,
    ),
    Check(
        "removed_unread",
        "removed_unread",
        lambda r: None if r.consumer_lag is None else float(sum(r.removed_unread.values())),
        _removed_unread,
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
    Check("open_breakers", "open_breakers", lambda r: float(r.open_breakers), _open_breakers, counts=True),
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
BY_NAME = {check.name: check for check in REGISTRY}
CHECKS = tuple(check.name for check in REGISTRY)


def describe(check: str, reading: Reading, threshold: float | None) -> Described:
    """A headline (the figure and its threshold), a sentence of detail, and the structured fields."""
    unit = "" if BY_NAME[check].counts else " s"
    limit = "check off" if threshold is None else f"threshold {_num(threshold)}{unit}"
    return BY_NAME[check].describe(reading, limit)
