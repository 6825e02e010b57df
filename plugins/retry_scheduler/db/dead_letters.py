"""The dead letters' port: every statement the dead-letter operations run (browse, replay, purge,
re-evaluate, watch, audit), each a method named for what it does. The statements are in
``sql/dlq.sql``; the operations (:mod:`retry_scheduler.ops.dlq` and its neighbours) hold the
logic and never see SQL or the driver.

A :class:`Chosen` is a :class:`~retry_scheduler.db.selection.Selection` as the statements filter
by it, opaque to its users. Transactions are the caller's (``with letters.transaction():``): an
operation decides what commits together (a batch and its audit count, for example).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeAlias

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from retry_scheduler.core import protocol
from retry_scheduler.core.jobs import CopyRow, ms_of_pg_time
from retry_scheduler.db.connection import connect, require_migrated
from retry_scheduler.db.schema import queries
from retry_scheduler.db.selection import Selection

if TYPE_CHECKING:  # the page's pool; the Spark executors, which import this module, have no psycopg_pool
    from psycopg_pool import ConnectionPool

#: Where the operations get their connection: a URL (a connection of their own, checked for the
#: schema), or a pool (the Dead letters page's, checked when it was made).
Database: TypeAlias = "str | ConnectionPool"


@contextmanager
def connection(database: Database) -> Iterator[psycopg.Connection[Any]]:
    """A connection for one operation: the pool's, or a new one checked for the schema."""
    if not isinstance(database, str):
        with database.connection() as pooled:
            pooled.prepare_threshold = None
            yield pooled
        return
    conn = connect(database)
    # Filters change the query's shape: plan each statement with its values, never a generic plan.
    conn.prepare_threshold = None
    try:
        require_migrated(conn, database)
        yield conn
    finally:
        conn.close()


@contextmanager
def dead_letters(database: Database) -> Iterator[DeadLetters]:
    """The port on a connection of its own (or the pool's) for one operation."""
    with connection(database) as conn:
        yield DeadLetters(conn)


@dataclass(frozen=True)
class Chosen:
    """Dead jobs as the statements select them: a filter's WHERE clause and its parameters, or the
    ids an operation fixed; ``limit``: the most, oldest first."""

    where: sql.Composable
    params: Mapping[str, Any]
    limit: int | None = None


def _dlq_query(name: str, where: sql.Composable) -> sql.Composed:
    """The named statement of ``sql/dlq.sql`` with a filter's WHERE clause in its ``{where}``."""
    return sql.SQL(queries()[name]).format(where=where)


def _run(
    conn: psycopg.Connection[Any], name: str, params: Mapping[str, Any] | None = None
) -> psycopg.Cursor[Any]:
    return conn.execute(sql.SQL(queries()[name]), params)


def _as_dicts(cur: psycopg.Cursor[Any]) -> list[dict[str, Any]]:
    names = [d.name for d in cur.description or []]
    return [
        {k: v.isoformat() if isinstance(v, datetime) else v for k, v in zip(names, row, strict=True)}
        for row in cur.fetchall()
    ]


def _ids(row: Sequence[Any] | None) -> tuple[int, ...]:
    return tuple(row[0] or []) if row else ()


class DeadLetters:
    """The dead letters' statements on one connection (:func:`dead_letters` opens one)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def transaction(self) -> AbstractContextManager[Any]:
        """One transaction: what runs inside commits together."""
        return self._conn.transaction()

    # -- what an operation selects ---------------------------------------------------------------

    @staticmethod
    def matching(selection: Selection) -> Chosen:
        """The dead jobs ``selection`` selects, as its filter (its limit left to the caller). A parked
        job goes back only when asked for (by its dead reason, or by its id)."""
        where, params = selection.where()
        params["with_parked"] = selection.dead_reason == protocol.DEAD_PARKED or bool(selection.ids)
        return Chosen(where, params)

    def choose(self, selection: Selection) -> Chosen:
        """The dead jobs ``selection`` selects, up to its limit: a limited selection is fixed to its
        ids first, so that the batches cannot drift to other jobs."""
        matching = self.matching(selection)
        where, params = matching.where, matching.params
        if selection.limit is None:
            return Chosen(where, params)
        with self._conn.transaction():
            got = self._conn.execute(
                _dlq_query("dlq_selected_ids", where), {**params, "limit": selection.limit}
            ).fetchone()
        ids = _ids(got)
        if not ids:  # nothing matched: the filter stays as it is and the plan counts 0
            return Chosen(where, params, selection.limit)
        # Any number of them (a limit may be millions): not a selection's ``ids`` (at most MAX_IDS,
        # what a person may type), the ids this operation fixed itself.
        return self.of_ids(ids, with_parked=params["with_parked"], limit=selection.limit)

    @staticmethod
    def of_ids(ids: Sequence[int], *, with_parked: bool, limit: int | None = None) -> Chosen:
        """The dead jobs of these ids (a limited selection, fixed; a watched replay's wave)."""
        return Chosen(
            sql.SQL("id = ANY(%(fixed_ids)s::bigint[])"),
            {"fixed_ids": list(ids), "with_parked": with_parked},
            limit,
        )

    def destinations(self, chosen: Chosen) -> list[tuple[str, int]]:
        """The destinations a replay of ``chosen`` would publish to, and how many jobs each."""
        rows = self._conn.execute(
            _dlq_query("dlq_plan_destinations", chosen.where), {**chosen.params, "limit": chosen.limit}
        ).fetchall()
        return [(str(t), int(n)) for t, n in rows]

    def replayable_ids(self, chosen: Chosen, refused: Sequence[str]) -> tuple[int, ...]:
        """The ids a replay of ``chosen`` would send, oldest first (``refused``: destinations left out)."""
        return _ids(
            self._conn.execute(
                _dlq_query("dlq_replayable_ids", chosen.where),
                {**chosen.params, "limit": chosen.limit, "refused": list(refused)},
            ).fetchone()
        )

    def plan(self, chosen: Chosen, refused: Sequence[str]) -> tuple[int, ...]:
        """The jobs ``chosen`` selects and those an operation would leave alone, by cause
        (:class:`retry_scheduler.ops.outcome.Plan`'s fields, in order)."""
        row = self._conn.execute(
            _dlq_query("dlq_plan", chosen.where),
            {**chosen.params, "limit": chosen.limit, "refused": list(refused)},
        ).fetchone()
        assert row is not None
        return tuple(int(n) for n in row)

    # -- replay and purge ------------------------------------------------------------------------

    def replay_batch(
        self,
        chosen: Chosen,
        *,
        after_id: int,
        batch: int,
        reset_attempts: bool,
        refused: Sequence[str],
        rate: float | None,
        rates: Mapping[str, float],
        start: datetime | None,
        sent: Mapping[str, int],
    ) -> list[tuple[int, str, datetime, str]]:
        """Make the next batch of ``chosen`` (ids above ``after_id``) due: each job's id, destination,
        the batch's start (the database's clock) and retry id. Paced at ``rate`` per destination
        (``rates``: those paced at their own limit), counting ``sent`` since ``start``."""
        rows = self._conn.execute(
            _dlq_query("dlq_replay_batch", chosen.where),
            {
                **chosen.params,
                "after_id": after_id,
                "batch": batch,
                "reset_attempts": reset_attempts,
                "refused": list(refused),
                "rate": rate,
                "rates": Jsonb(dict(rates)),
                "start": start,
                "sent": Jsonb(dict(sent)),
            },
        ).fetchall()
        return [(int(r[0]), str(r[1]), r[2], str(r[3])) for r in rows]

    def purge_batch(self, chosen: Chosen, *, after_id: int, batch: int) -> list[int]:
        """Delete the next batch of ``chosen`` whose record is on the DLQ topic; their ids."""
        rows = self._conn.execute(
            _dlq_query("dlq_purge_batch", chosen.where),
            {**chosen.params, "after_id": after_id, "batch": batch},
        ).fetchall()
        return [int(r[0]) for r in rows]

    # -- a watched replay ------------------------------------------------------------------------

    def mark(self) -> int:
        """Where a wave's watch starts: a record stored after it has a larger id."""
        row = _run(self._conn, "watch_mark").fetchone()
        return int(row[0]) if row else 0

    def wave(self, ids: Sequence[int]) -> tuple[int, int, datetime | None, datetime | None, datetime]:
        """A wave's jobs still pending, those published, the last published, the last due of those
        pending, and the database's clock."""
        row = _run(self._conn, "watch_wave", {"ids": list(ids)}).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), row[2], row[3], row[4]

    def came_back(self, mark: int, retry_ids: Sequence[str]) -> int:
        """How many of ``retry_ids`` were stored again since ``mark`` (each counted once)."""
        row = _run(self._conn, "watch_came_back", {"mark": mark, "retry_ids": list(retry_ids)}).fetchone()
        return int(row[0]) if row else 0

    # -- re-evaluation ---------------------------------------------------------------------------

    def invalid_count(self, chosen: Chosen) -> int:
        """How many dead invalid jobs of ``chosen`` a re-evaluation would read."""
        row = self._conn.execute(_dlq_query("reevaluate_count", chosen.where), chosen.params).fetchone()
        return int(row[0]) if row else 0

    def invalid_batch(self, chosen: Chosen, *, after_id: int, batch: int) -> list[tuple[Any, ...]]:
        """The next dead invalid jobs of ``chosen`` as stored: id, source topic, partition, offset,
        timestamp (ms), key, value, headers."""
        return self._conn.execute(
            _dlq_query("reevaluate_batch", chosen.where),
            {**chosen.params, "after_id": after_id, "batch": batch},
        ).fetchall()

    def lock_invalid(self, ids: Sequence[int]) -> set[int]:
        """Lock the ones of ``ids`` no one else holds (a replay, the publisher's DLQ lease); their ids."""
        return {int(r[0]) for r in _run(self._conn, "reevaluate_lock", {"ids": list(ids)}).fetchall()}

    def make_pending(self, passing: Sequence[tuple[int, CopyRow]]) -> None:
        """The jobs that pass now: pending, with what the current configuration makes of their record."""
        if not passing:
            return
        rows = [r for _, r in passing]
        _run(
            self._conn,
            "reevaluate_pending",
            {
                "ids": [i for i, _ in passing],
                "destinations": [r.destination for r in rows],
                "destination_partitions": [r.destination_partition for r in rows],
                "headers": [r.headers for r in rows],
                "attempts": [r.attempt for r in rows],
                "policies": [r.policy for r in rows],
                "reasons": [r.reason for r in rows],
                "error_classes": [r.error_class for r in rows],
                "groups": [r.consumer_group for r in rows],
                "retry_ids": [r.retry_id for r in rows],
                "original_topics": [r.original_topic for r in rows],
                "original_partitions": [r.original_partition for r in rows],
                "original_offsets": [r.original_offset for r in rows],
                "first_seen": [_time(r.first_seen_at) for r in rows],
                "due": [_time(r.due_at) for r in rows],
                "dlq_topics": [r.dlq_topic for r in rows],
            },
        )

    def still_dead(self, dead: Sequence[tuple[int, str, str]]) -> None:
        """The jobs that still do not pass: dead with their new dead reason and reason."""
        if dead:
            _run(
                self._conn,
                "reevaluate_dead",
                {
                    "ids": [d[0] for d in dead],
                    "dead_reasons": [d[1] for d in dead],
                    "reasons": [d[2] for d in dead],
                },
            )

    # -- browsing --------------------------------------------------------------------------------

    def page(
        self, chosen: Chosen, *, after_at: datetime | None, after_id: int | None, size: int
    ) -> list[tuple[Any, ...]]:
        """Dead jobs of ``chosen``, newest first, after the cursor (``after_at``, ``after_id``)."""
        return self._conn.execute(
            _dlq_query("dlq_page", chosen.where),
            {**chosen.params, "after_at": after_at, "after_id": after_id, "page_size": size},
        ).fetchall()

    def count(self, chosen: Chosen, *, cap: int) -> int:
        """How many dead jobs ``chosen`` selects, counted up to ``cap``."""
        row = self._conn.execute(
            _dlq_query("dlq_count", chosen.where), {**chosen.params, "cap": cap}
        ).fetchone()
        return int(row[0]) if row else 0

    def facets(self) -> list[tuple[str, str, int]]:
        """Dead jobs per destination ('' for none) and dead reason."""
        return [(str(r[0]), str(r[1]), int(r[2])) for r in _run(self._conn, "dlq_facets").fetchall()]

    def job(self, job_id: int) -> dict[str, Any] | None:
        """Every column of one job (any status), or None."""
        cur = _run(self._conn, "dlq_job", {"id": job_id})
        row = cur.fetchone()
        if row is None:
            return None
        return dict(zip([d.name for d in cur.description or []], row, strict=True))

    # -- the audit -------------------------------------------------------------------------------

    def start_audit(self, fields: Mapping[str, Any]) -> int:
        """An operation's audit row (``fields``: the columns of ``dlq_audit_start``); its id."""
        json_fields = ("filter", "skipped", "watch")
        row = _run(
            self._conn,
            "dlq_audit_start",
            {k: Jsonb(v) if k in json_fields and v is not None else v for k, v in fields.items()},
        ).fetchone()
        assert row is not None
        return int(row[0])

    def count_affected(self, audit_id: int, affected: int) -> None:
        """Add ``affected`` jobs to the audit row (in the transaction that changed them)."""
        _run(self._conn, "dlq_audit_progress", {"affected": affected, "audit_id": audit_id})

    def count_matched(self, audit_id: int, matched: int, skipped: Mapping[str, int]) -> None:
        """A re-evaluation's count, known at its end."""
        _run(
            self._conn,
            "dlq_audit_counted",
            {"matched": matched, "skipped": Jsonb(dict(skipped)), "audit_id": audit_id},
        )

    def count_waves(self, audit_id: int, *, published: int, came_back: int, stopped: str | None) -> None:
        """A watched replay's records published and come back so far, and why it stopped."""
        _run(
            self._conn,
            "watch_progress",
            {"published": published, "came_back": came_back, "stopped": stopped, "audit_id": audit_id},
        )

    def finish_audit(self, audit_id: int) -> None:
        _run(self._conn, "dlq_audit_finish", {"audit_id": audit_id})

    def record_approval(self, audit_id: int, approval: str, approved_by: str) -> None:
        _run(
            self._conn,
            "dlq_audit_approval",
            {"audit_id": audit_id, "approval": approval, "approved_by": approved_by},
        )

    def recent_audit(self, limit: int) -> list[dict[str, Any]]:
        """The latest audit rows, newest first (times in ISO 8601)."""
        return _as_dicts(_run(self._conn, "dlq_audit_recent", {"limit": limit}))

    def audit_of_run(self, run_id: str, action: str) -> dict[str, Any] | None:
        """An Airflow run's latest audit row of ``action``."""
        rows = _as_dicts(_run(self._conn, "dlq_audit_of_run", {"run_id": run_id, "action": action}))
        return rows[0] if rows else None


def _time(pg_us: int) -> datetime:
    return datetime.fromtimestamp(ms_of_pg_time(pg_us) / 1000, UTC)
