"""A dead-letter operation's batches: replay or purge what it chose, a batch per transaction, each
counted on the audit row in its own transaction (its count exact after a crash); and a watched
wave's verdict, counted (:func:`retry_scheduler.ops.dlq.run_action` calls them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from retry_scheduler.core import faults
from retry_scheduler.db.dead_letters import Chosen, DeadLetters
from retry_scheduler.ops.outcome import Outcome
from retry_scheduler.ops.watch import WaveVerdict

if TYPE_CHECKING:
    from retry_scheduler.ops.dlq import Operation


@dataclass
class Pace:
    """A paced replay's clock, kept across its batches and waves."""

    start: datetime | None
    sent: dict[str, int]


def apply_batches(
    letters: DeadLetters,
    operation: Operation,
    outcome: Outcome,
    chosen: Chosen,
    refused: Sequence[str],
    pace: Pace,
    batch_size: int,
    progress: Callable[[int, int], None],
    *,
    keep: bool,
) -> tuple[list[int], list[str]]:
    """Replay or purge ``chosen`` (a replay leaves the ``refused`` destinations' jobs dead), a batch per
    transaction, each audited in its transaction. ``keep`` (a watched wave, at most a batch of ids):
    returns the ids changed and their retry ids; otherwise none are kept (an unwatched replay or purge
    may change millions)."""
    changed: list[int] = []
    retry_ids: list[str] = []
    after_id = 0
    while True:
        with letters.transaction():
            if operation.action == "replay":
                rows = letters.replay_batch(
                    chosen, after_id=after_id, batch=batch_size, reset_attempts=operation.reset_attempts,
                    refused=refused, rate=outcome.rate_per_s, rates=outcome.rate_limited,
                    start=pace.start, sent=pace.sent,
                )  # fmt: skip
                done = [job_id for job_id, *_ in rows]
                for _id, destination, start, retry_id in rows:  # counted for the next batch's pace
                    pace.sent[destination] = pace.sent.get(destination, 0) + 1
                    pace.start = pace.start or start
                    if keep:
                        retry_ids.append(retry_id)
            else:
                done = letters.purge_batch(chosen, after_id=after_id, batch=batch_size)
            if done:
                assert outcome.audit_id is not None
                letters.count_affected(outcome.audit_id, len(done))
                faults.checkpoint("dlq.batch")  # chaos: die before this batch commits
        if not done:
            return changed, retry_ids
        if keep:
            changed += done
        outcome.affected += len(done)
        after_id = max(done)
        progress(outcome.affected, outcome.would_affect)


def record_wave(letters: DeadLetters, outcome: Outcome, verdict: WaveVerdict) -> None:
    """Count a watched wave in the outcome and its audit row."""
    outcome.published += verdict.published
    outcome.came_back += verdict.came_back
    outcome.stopped = verdict.stopped
    assert outcome.audit_id is not None
    with letters.transaction():
        letters.count_waves(
            outcome.audit_id,
            published=outcome.published,
            came_back=outcome.came_back,
            stopped=outcome.stopped,
        )
