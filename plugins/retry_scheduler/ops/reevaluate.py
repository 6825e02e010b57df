"""Dead ``invalid`` jobs read again against the current configuration (``dlq replay --reevaluate``).

A record stored invalid because of the deployment's configuration (its destination not yet allowed,
its ``retry.policy`` not yet deployed, no policies module at all) has no destination, so a replay
leaves it alone. Its record is kept as it came (key, value, every header), so once the configuration
is fixed it can be evaluated again exactly as the ingest loop would evaluate it now: the jobs that pass
become pending (published when due, their bytes unchanged), the others stay dead with what the
current configuration says of them. Audited as ``reevaluate``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from retry_scheduler.core import protocol
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.jobs import CopyRow, Status, decode_headers
from retry_scheduler.core.records import RowBuilder
from retry_scheduler.db.dead_letters import Chosen, Database, DeadLetters, dead_letters
from retry_scheduler.ops.dlq import (
    BATCH,
    MAX_LIMIT,
    DlqError,
    Operation,
    Outcome,
    TooManyForOneRequest,
    start_audit,
)

#: The dead reason a re-evaluation selects; a filter naming another is refused.
_INVALID = protocol.DEAD_INVALID


def reevaluate(
    database_url: Database,
    operation: Operation,
    *,
    deployment: Deployment,
    progress: Callable[[int, int], None] = lambda done, total: None,
    batch_size: int = BATCH,
) -> Outcome:
    """Evaluate the dead invalid jobs ``operation`` selects (its action ``reevaluate``) again with
    ``deployment`` (the current settings and policies); on a dry run only count what would pass. One
    audit row (action ``reevaluate``).

    ``skipped`` counts the jobs that still do not pass, by what they are now (``invalid``, or
    ``exhausted``, ``fatal``... when the record asked for what is now a dead end), plus held records
    (``retry.hold``), which are sent again by their application, not re-evaluated. A re-evaluated job
    keeps its attempt (an operation with ``reset_attempts`` is refused when made). With the operation's
    ``max_affected``, a re-evaluation (not a dry run) that could make more jobs pending (more invalid
    jobs match) is refused before anything is written
    (:class:`~retry_scheduler.ops.dlq.TooManyForOneRequest`).
    """
    if not 1 <= batch_size <= MAX_LIMIT:
        raise DlqError(f"batch size {batch_size} must be between 1 and {MAX_LIMIT:,}")
    if operation.action != "reevaluate":
        raise DlqError(f"action {operation.action!r}: reevaluate runs re-evaluations only")
    flt, dry_run, max_affected = operation.selection, operation.dry_run, operation.max_affected
    if flt.dead_reason not in (None, _INVALID):
        raise DlqError(f"re-evaluation reads invalid jobs only, not {flt.dead_reason!r} ones")
    outcome = Outcome(
        action="reevaluate", dry_run=dry_run, filter=flt.as_dict(), matched=0, would_affect=0, affected=0
    )
    with dead_letters(database_url) as letters:
        chosen = letters.matching(flt)
        if not dry_run and max_affected is not None:
            with letters.transaction():
                could = min(letters.invalid_count(chosen), flt.limit or MAX_LIMIT)
            if could > max_affected:
                raise TooManyForOneRequest("reevaluate", could, max_affected)
        outcome.audit_id = start_audit(letters, operation, outcome)
        _batches(letters, RowBuilder(deployment), chosen, flt.limit, batch_size, outcome, progress)
        with letters.transaction():
            letters.count_matched(outcome.audit_id, outcome.matched, outcome.skipped)
            letters.finish_audit(outcome.audit_id)
    return outcome


def _batches(
    letters: DeadLetters,
    builder: RowBuilder,
    chosen: Chosen,
    limit: int | None,
    batch_size: int,
    outcome: Outcome,
    progress: Callable[[int, int], None],
) -> None:
    """Read the selected invalid jobs a batch per transaction, evaluate each again and (not on a dry
    run) make those that pass pending and the others dead for their new reason, counting both."""
    dry_run = outcome.dry_run
    after_id, left = 0, limit
    while left is None or left > 0:
        size = batch_size if left is None else min(batch_size, left)
        with letters.transaction():
            rows = letters.invalid_batch(chosen, after_id=after_id, batch=size)
            if not rows:
                return
            after_id = rows[-1][0]
            if not dry_run:  # the jobs no one else holds (a replay, the publisher's DLQ lease)
                locked = letters.lock_invalid([r[0] for r in rows])
                rows = [r for r in rows if r[0] in locked]
            passing, dead = _evaluate(builder, rows)
            if not dry_run:
                letters.make_pending(passing)
                # a held record's (dead reason None) is left as it is
                letters.still_dead([(i, d, r) for i, d, r in dead if d is not None])
                if passing:
                    assert outcome.audit_id is not None
                    letters.count_affected(outcome.audit_id, len(passing))
        outcome.matched += len(rows)
        outcome.would_affect += len(passing)
        outcome.affected += 0 if dry_run else len(passing)
        for _id, dead_reason, _reason in dead:
            cause = (
                "held records (retry.hold): send them again"
                if dead_reason is None
                else f"still {dead_reason}"
            )
            outcome.skipped[cause] = outcome.skipped.get(cause, 0) + 1
        if left is not None:
            left -= len(rows)
        progress(outcome.matched, outcome.matched)


def _evaluate(
    builder: RowBuilder, rows: list[tuple[Any, ...]]
) -> tuple[list[tuple[int, CopyRow]], list[tuple[int, str | None, str]]]:
    """The jobs that pass now (their new row) and those that do not (new dead reason and reason; a
    held record's reason None: left as it is)."""
    now_ms = int(time.time() * 1000)
    passing: list[tuple[int, CopyRow]] = []
    dead: list[tuple[int, str | None, str]] = []
    for job_id, topic, partition, offset, timestamp_ms, key, value, headers in rows:
        try:
            decoded = decode_headers(headers)
        except Exception as exc:  # stored by an older version, or not at all: nothing to evaluate
            dead.append((job_id, _INVALID, f"its headers cannot be read again ({type(exc).__name__}: {exc})"))
            continue
        row = builder.row(topic, partition, offset, timestamp_ms, key, value, decoded, now_ms)
        builder.take_chain_events()
        builder.take_notices()
        if row is None:
            dead.append((job_id, _INVALID, "a release record (retry.release): nothing to retry"))
        elif row.held_by is not None:
            dead.append((job_id, None, ""))
        elif row.status == Status.PENDING.value:
            passing.append((job_id, row))
        else:
            dead.append((job_id, row.dead_reason or _INVALID, row.reason or ""))
    return passing, dead
