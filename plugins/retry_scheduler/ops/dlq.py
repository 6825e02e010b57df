"""Dead-letter operations: the filter, replay and purge of dead jobs, each change audited (browsing
them is :mod:`retry_scheduler.ops.browse`).

One implementation behind the three ways in: the ``dlq_replay`` DAG, the Dead letters page of
the Airflow UI (``retry_scheduler.airflow.webui.app``) and ``retry-scheduler dlq``. They choose jobs
with :class:`~retry_scheduler.db.selection.Selection` (as the Spark bulk retry does), so a filter
means the same everywhere.

- **Replay** makes dead jobs due now; the normal publish loop sends them to their destination
  with ``retry.attempt`` raised (reset to 0 first when asked). Jobs that went dead as
  ``invalid`` are left alone: their headers named no usable destination.
- **Purge** deletes dead jobs whose record is already on the DLQ topic. A dead job whose record
  has not reached the DLQ topic yet exists nowhere else, so it is kept.
- **Pace**: a replay may be paced, at most ``rate_per_s`` jobs of each destination falling due per
  second (the publish loop sends each when due, never early). Without a rate of its own, a replay of
  at most :data:`UNPACED_UP_TO` jobs per destination is not paced; a larger one is paced at
  :data:`DEFAULT_REPLAY_RATE`; a rate of 0 asks for no pace. The output says which.
- Both work in batches of :data:`BATCH` jobs, one transaction each, so a million-job purge
  neither holds a million row locks nor loses its progress; the audit row of the operation is
  updated in the same transaction as each batch, so its count is exact even after a crash.
- **Watch**: a replay may be watched (:mod:`retry_scheduler.ops.watch`): a canary first, the rest in
  waves, each watched for records that come back before the next goes; it stops by itself.
- A dry run computes the same selection and writes an audit row, changing nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from retry_scheduler.core import faults, rates
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.jobs import Status
from retry_scheduler.db.dead_letters import Chosen, Database, DeadLetters, dead_letters
from retry_scheduler.db.selection import MAX_LIMIT, Selection, SelectionError
from retry_scheduler.ops.batches import Pace, apply_batches, record_wave
from retry_scheduler.ops.outcome import Action, Outcome, Plan
from retry_scheduler.ops.watch import Watch, watch_wave

#: Jobs changed per transaction by replay and purge.
BATCH = 10_000
#: The most jobs the Dead letters page replays or purges inside one HTTP request; more go through
#: the ``dlq_replay`` DAG (a run with its own log, retries and progress).
MAX_PAGE_ACTION = 10_000

#: A replay without a rate of its own is not paced up to UNPACED_UP_TO jobs per destination; a larger one
#: is paced at DEFAULT_REPLAY_RATE jobs per second per destination (both in core.rates).
UNPACED_UP_TO = rates.UNPACED_UP_TO
DEFAULT_REPLAY_RATE = rates.DEFAULT_REPLAY_RATE
#: The highest pace one may ask for (jobs per second per destination).
MAX_RATE = rates.MAX_RATE

Source = Literal["dag", "ui", "cli"]


class DlqError(SelectionError):
    """A filter or request is invalid, or the job asked for does not exist; the message says which."""


class TooManyForOneRequest(DlqError):
    """An operation would change more jobs than ``max_affected`` allows; nothing was written."""

    def __init__(self, action: Action, would_affect: int, max_affected: int) -> None:
        super().__init__(
            f"{would_affect:,} jobs is more than the {max_affected:,} this page {action}s at "
            "once: trigger the dlq_replay DAG with this filter instead (or narrow the filter)"
        )
        self.action, self.would_affect, self.max_affected = action, would_affect, max_affected


@dataclass(frozen=True)
class Approval:
    """A replay's approval (the ``dlq_replay`` DAG's gate): who gave it, and how many jobs of the
    filter, the oldest, its approver was shown."""

    by: str
    matched: int


@dataclass(frozen=True)
class Operation:
    """One dead-letter operation as asked: what, on which dead jobs, who asked and through which
    way in. It is audited as it is; invalid ones are refused when made (:class:`DlqError`)."""

    action: Action
    selection: Selection
    #: Who asked (a user name, ``cli:<login>``, ``airflow``): the audit's actor.
    actor: str
    source: Source
    #: Only count, and audit the count; change nothing.
    dry_run: bool
    #: A replay sends the jobs with ``retry.attempt`` 0 + 1 (replay only).
    reset_attempts: bool = False
    #: The Airflow run that asked (audited).
    run_id: str | None = None
    #: An operation (not a dry run) that would change more jobs is refused before anything is written
    #: (:class:`TooManyForOneRequest`).
    max_affected: int | None = None
    #: A replay's pace: at most this many jobs of each destination fall due per second; 0: not paced;
    #: None: the default (not paced up to :data:`UNPACED_UP_TO` jobs per destination, else
    #: :data:`DEFAULT_REPLAY_RATE`). :func:`parse_rate` reads it from a form or a command line.
    rate_per_s: float | None = None
    #: Watch the replay: a canary first, the rest in waves, stopping by itself (replay only).
    watch: Watch | None = None
    #: Who approved the replay (the approval gate of the ``dlq_replay`` DAG): audited beside ``actor``.
    approved_by: str | None = None

    def __post_init__(self) -> None:
        if self.action not in ("replay", "purge", "reevaluate"):
            raise DlqError(f"action {self.action!r} must be replay, purge or reevaluate")
        if not self.actor:
            raise DlqError("an operation needs an actor (who asked for it) for the audit")
        dead_only(self.selection)
        if self.reset_attempts and self.action == "reevaluate":
            raise DlqError("reset_attempts does not go with reevaluate: a re-evaluated job keeps its attempt")
        if self.reset_attempts and self.action != "replay":
            raise DlqError("reset_attempts applies to replay only")
        if self.rate_per_s is not None:
            object.__setattr__(self, "rate_per_s", parse_rate(self.rate_per_s))
            if self.action != "replay":
                raise DlqError("a rate applies to replay only")
        if self.watch is not None and self.action != "replay":
            raise DlqError("a canary or a stop share applies to replay only")
        if self.approved_by is not None and self.approved_by == self.actor:
            raise DlqError(
                f"{self.actor} approved their own replay: it needs a second person's approval (nothing was sent)"
            )

    def pace(self, per_destination: dict[str, int]) -> float | None:
        """The jobs per second per destination this replay goes at (None: not paced), given how many
        jobs of each destination it replays."""
        if self.rate_per_s is not None:
            return self.rate_per_s or None
        return DEFAULT_REPLAY_RATE if max(per_destination.values(), default=0) > UNPACED_UP_TO else None


def parse_rate(value: object) -> float | None:
    """A replay's rate as a form, the page or a command line gives it
    (:func:`retry_scheduler.core.rates.parse_rate`); refused with a :class:`DlqError` that says what
    to give."""
    try:
        return rates.parse_rate(value)
    except rates.RateError as exc:
        raise DlqError(str(exc)) from None


def dead_only(flt: Selection) -> Selection:
    """``flt``, checked to select dead jobs: the dead-letter operations act on no other."""
    if flt.status is not Status.DEAD:
        raise DlqError(f"the dead-letter operations select dead jobs, not {flt.status} ones")
    return flt


def run_action(
    database_url: Database,
    operation: Operation,
    *,
    deployment: Deployment | None = None,
    progress: Callable[[int, int], None] = lambda done, total: None,
    batch_size: int = BATCH,
) -> Outcome:
    """Replay, purge or re-evaluate the dead jobs ``operation`` selects (dry run: only count), writing
    one audit row: the one runner of the dead-letter operations, whichever way in asked.

    A replay needs the ``deployment``, and asks it for each destination's rules: the jobs of a
    destination it no longer allows are left dead, counted under ``skipped``; a destination whose
    rate limit is below the replay's pace goes at its limit (the publish loop holds to it either way).
    A purge needs none. A re-evaluation needs it too, and is :func:`retry_scheduler.ops.reevaluate.reevaluate`'s.
    ``progress(done, total)`` is called after each batch.
    ``batch_size`` jobs change per transaction (:data:`BATCH` by default).

    Its steps, each a function: select (:func:`_select`), plan (:func:`_plan`; a dry run stops after
    auditing it), audit (:func:`start_audit`), then the batches, wave by wave (:func:`_send`).
    """
    if not 1 <= batch_size <= MAX_LIMIT:
        raise DlqError(f"batch size {batch_size} must be between 1 and {MAX_LIMIT:,}")
    if operation.action in ("replay", "reevaluate") and deployment is None:
        raise ValueError(f"a {operation.action} needs the deployment (its destinations' rules and policies)")
    if operation.action == "reevaluate":
        from retry_scheduler.ops.reevaluate import reevaluate  # its module builds on this one

        assert deployment is not None
        return reevaluate(
            database_url, operation, deployment=deployment, progress=progress, batch_size=batch_size
        )
    with dead_letters(database_url) as letters:
        selected = _select(letters, operation, deployment)
        outcome, waves = _plan(letters, operation, deployment, selected)
        limit = operation.max_affected
        if not operation.dry_run and limit is not None and outcome.would_affect > limit:
            raise TooManyForOneRequest(operation.action, outcome.would_affect, limit)
        outcome.audit_id = start_audit(letters, operation, outcome)
        if not operation.dry_run and outcome.matched:
            _send(letters, operation, outcome, selected, waves, batch_size, progress)
        with letters.transaction():
            letters.finish_audit(outcome.audit_id)
    return outcome


@dataclass
class _Selected:
    """What an operation selected (a limited selection fixed to its ids), and for a replay, its jobs
    per allowed destination and the destinations refused."""

    chosen: Chosen
    per_destination: dict[str, int]
    refused: list[str]


def _select(letters: DeadLetters, operation: Operation, deployment: Deployment | None) -> _Selected:
    chosen = letters.choose(operation.selection)
    selected = _Selected(chosen, {}, [])
    if operation.action == "replay":
        assert deployment is not None
        rules = deployment.destinations
        with letters.transaction():
            targets = letters.destinations(chosen)
        selected.refused = sorted(t for t, _n in targets if not rules.allows(t))
        selected.per_destination = {t: n for t, n in targets if rules.allows(t)}
    return selected


def _plan(
    letters: DeadLetters, operation: Operation, deployment: Deployment | None, selected: _Selected
) -> tuple[Outcome, list[Any]]:
    """What the operation would do (the dry run's outcome), and its waves (``[None]``: one pass)."""
    action, per_destination = operation.action, selected.per_destination
    rate = operation.pace(per_destination) if action == "replay" else None
    # Destinations whose rate limit is below the replay's pace go at their limit.
    limited = {
        d: limit
        for d in per_destination
        if deployment is not None
        and (limit := deployment.policies.rules(d).rate_limit) is not None
        and (rate is None or limit < rate)
    }
    watch = operation.watch
    waves: list[Any] = [None]  # unwatched: one pass over the filter
    if watch is not None:
        with letters.transaction():
            waves = watch.waves(letters.replayable_ids(selected.chosen, selected.refused))
    with letters.transaction():
        plan = Plan(*letters.plan(selected.chosen, selected.refused))
    skipped = plan.skipped(action)
    # The most jobs of one destination, less the first (due at the start), at its pace.
    paced_s = max(
        [
            (n - 1) / (limited.get(d) or rate or 0)
            for d, n in per_destination.items()
            if limited.get(d) or rate
        ],
        default=0.0,
    )
    outcome = Outcome(
        action=action,
        dry_run=operation.dry_run,
        filter=operation.selection.as_dict(),
        matched=plan.matched,
        would_affect=max(0, plan.matched - sum(skipped.values())),
        affected=0,
        skipped=skipped,
        reset_attempts=operation.reset_attempts,
        rate_per_s=rate,
        paced_s=paced_s,
        rate_limited=limited,
        per_destination=per_destination,
        default_pace=operation.rate_per_s is None,
        watch=None if watch is None else watch.as_dict(),
        waves=len(waves) if watch is not None else 0,
    )
    return outcome, waves


def start_audit(letters: DeadLetters, operation: Operation, outcome: Outcome) -> int:
    """The operation's audit row, as planned (``outcome``: what it selected and how it goes); its id."""
    with letters.transaction():
        return letters.start_audit(
            {
                "action": operation.action,
                "dry_run": operation.dry_run,
                "actor": operation.actor,
                "source": operation.source,
                "run_id": operation.run_id,
                "filter": outcome.filter,
                "reset_attempts": operation.reset_attempts,
                "matched": outcome.matched,
                "skipped": {k: v for k, v in outcome.skipped.items() if v},
                "rate_per_s": outcome.rate_per_s,
                "watch": outcome.watch,
                "approved_by": operation.approved_by,
            }
        )


def _send(
    letters: DeadLetters,
    operation: Operation,
    outcome: Outcome,
    selected: _Selected,
    waves: list[Any],
    batch_size: int,
    progress: Callable[[int, int], None],
) -> None:
    """Replay or purge, wave by wave (one pass when unwatched), watching each wave of a watched replay
    and stopping where its verdict says."""
    watch, chosen = operation.watch, selected.chosen
    # A paced replay's clock: its n-th job of a destination is due (n - 1) / rate after the first
    # batch's start (the database's clock, returned by that batch); across waves too.
    pace = Pace(start=None, sent=dict.fromkeys(selected.per_destination, 0))
    for number, wave in enumerate(waves):
        if wave is None:
            wave_chosen = chosen
        else:
            with letters.transaction():
                since = letters.mark()
            wave_chosen = letters.of_ids(wave, with_parked=chosen.params["with_parked"])
        done, retry_ids = apply_batches(
            letters, operation, outcome, wave_chosen, selected.refused, pace, batch_size, progress,
            keep=wave is not None,
        )  # fmt: skip
        if wave is None or watch is None or not done:
            continue
        faults.checkpoint("dlq.watch")  # chaos: die while a wave is watched, the rest not sent
        verdict = watch_wave(
            letters, watch, ids=done, retry_ids=retry_ids, since=since,
            canary=number == 0 and watch.has_canary(),
            published_before=outcome.published, came_back_before=outcome.came_back,
            remaining=sum(len(w) for w in waves[number + 1 :]),
        )  # fmt: skip
        record_wave(letters, outcome, verdict)
        if verdict.stopped:
            return


def record_approval(database_url: Database, audit_id: int, approval: str, approved_by: str) -> None:
    """The approval gate's decision (``approved``, ``rejected``, or ``refused``: the requester approved
    their own replay) and who took it, on the audit row of the dry run the approver was shown."""
    if approval not in ("approved", "rejected", "refused"):
        raise DlqError(f"approval {approval!r} must be approved, rejected or refused")
    with dead_letters(database_url) as letters, letters.transaction():
        letters.record_approval(audit_id, approval, approved_by)


def recent_audit(database_url: Database, limit: int = 20) -> list[dict[str, Any]]:
    """The latest audit rows, newest first."""
    with dead_letters(database_url) as letters:
        return letters.recent_audit(limit)


def audit_of_run(database_url: Database, run_id: str, action: str) -> dict[str, Any] | None:
    """The audit row of an Airflow run's ``action`` (``replay``, ``bulk_replay``...): its latest one."""
    with dead_letters(database_url) as letters:
        return letters.audit_of_run(run_id, action)


def to_json(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)
