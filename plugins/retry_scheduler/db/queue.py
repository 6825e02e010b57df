"""The queue: the ingest's and the publish loop's statements, storing new jobs in bulk, claiming
them when due and marking what became of them (the other parts of the store, each named for who
uses it, are in :mod:`retry_scheduler.db.store`).

Its SQL is the named queries of ``sql/queries.sql`` (:mod:`retry_scheduler.db.schema`); this module
passes parameters and never formats SQL.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from psycopg.adapt import PyFormat

from retry_scheduler.core import protocol
from retry_scheduler.core.jobs import COPY_TYPES, CopyRow, OutgoingRow
from retry_scheduler.db.breakers import count_came_back
from retry_scheduler.db.connection import joined, require_transaction
from retry_scheduler.db.overdue import OverdueNotices, notify_committed_late, notify_overdue
from retry_scheduler.db.readings import HELD_DUE_AT
from retry_scheduler.db.schema import q

log = logging.getLogger(__name__)

#: A job that died in any of these ways may be a blocker whose held jobs must now go (an adopted one never is).
_BLOCKER_DEATHS = frozenset(protocol.DEAD_REASONS) - {protocol.DEAD_ADOPTED}

#: The errors a COPY fails with because of what a row holds, not because of the connection or the
#: server: a value the column's type or the server's encoding cannot hold (class 22, "data exception":
#: a NUL in text, an untranslatable character), a constraint other than the unique source identity
#: (class 23), a value too large for an index (class 54).
_ROW_ERRORS: tuple[type[Exception], ...] = (
    psycopg.errors.DataError,
    psycopg.errors.IntegrityError,
    psycopg.errors.ProgramLimitExceeded,
)


class RowsRefused(Exception):
    """The server refused rows of a batch for what they hold (:data:`_ROW_ERRORS`), and nothing of the
    batch was stored. ``refusals``: each refused row's index in the batch and the server's error
    (:func:`refusal_reason`). The ingest stores a dead row in place of each, and the batch again."""

    def __init__(self, refusals: Sequence[tuple[int, str]]) -> None:
        super().__init__(f"PostgreSQL refused {len(refusals)} row(s) of the batch: {refusals[0][1]}")
        self.refusals = list(refusals)


def refusal_reason(exc: Exception) -> str:
    """What the server said about a refused row: its message and where (the COPY line and column).

    ASCII, whatever the server's encoding and whatever the message quotes: it is stored as text itself.
    """
    diag = getattr(exc, "diag", None)
    message = (getattr(diag, "message_primary", None) or str(exc)).strip()
    where = " ".join((getattr(diag, "context", None) or "").split())
    sqlstate = getattr(diag, "sqlstate", None)
    text = f"PostgreSQL refused the record: {message}" + (f" ({where})" if where else "")
    text += f" [SQLSTATE {sqlstate}]" if sqlstate else ""
    return text.encode("ascii", "backslashreplace").decode("ascii").replace("\x00", "\\x00")


class VacuumNeed(NamedTuple):
    """What the publish loop's own vacuum weighs (:meth:`Queue.vacuum_need`)."""

    covered: bool  # autovacuum covers retry_jobs (the server's and the table's setting)
    dead_rows: int  # the server's statistics
    live_rows: int
    horizon: str | None  # the oldest snapshot another session of this database holds (its xmin)


class Queue:
    """The ingest's and the publish loop's statements, on the store's connection ``conn``."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        #: When the last ``claim_due`` began (the server's clock): every pending job due by then was
        #: open to it.
        self.claimed_up_to: datetime | None = None
        #: The destinations this queue recorded in ``retry_destinations`` (or found there): a batch
        #: for one of these writes nothing more.
        self._registered: set[str] = set()
        # COPY picks a dumper by column type; for bytea psycopg's registry answers with the DB-API
        # ``Binary`` wrapper's Python dumper. Registering the one for ``bytes`` again makes it the C one.
        conn.adapters.register_dumper(bytes, conn.adapters.get_dumper(bytes, PyFormat.BINARY))

    def listen_overdue(self) -> OverdueNotices:
        """Hear, on this connection, of jobs stored after their due time (:mod:`.overdue`)."""
        return OverdueNotices(self.conn)

    def insert_rows(
        self,
        rows: Sequence[CopyRow],
        *,
        consumer_group: str | None = None,
        offsets: Mapping[tuple[str, int], int] | None = None,
        adopted_topics: Collection[str] = (),
        chain_events: Sequence[tuple[str, str, str | None]] = (),
        counted_back: Collection[str] = (),
    ) -> list[str | None]:
        """Store new jobs (:class:`~retry_scheduler.core.jobs.CopyRow`) and, in the same transaction, the next
        ``offsets`` to read of ``consumer_group``'s retry-topic partitions.

        Dead jobs read from ``adopted_topics`` (other tools' dead-letter topics) are marked delivered
        to their DLQ topic in the same transaction: they are on one already. ``chain_events`` (ordered
        mode: what the batch's records say of their chains, in their order,
        :attr:`~retry_scheduler.core.records.RowBuilder.chain_events`) set each chain's state, and the
        chains they name or whose held jobs the batch stores let their next held job fall due
        (:meth:`advance_holds`).

        The rows go straight into ``retry_jobs`` with one binary COPY. If one of them is stored
        already (the same source record, read again), the batch goes through a staging table instead
        and only the new ones are stored. Returns the dead reason (None for pending) of each row
        stored. Commits before returning, so the caller may then commit the Kafka offsets.

        When the server refuses the COPY because of what a row holds (``_ROW_ERRORS``), the batch is
        halved until every refused row is found, nothing is stored, and :class:`RowsRefused` says
        which rows and why: the ingest replaces each by a dead row that keeps the record's bytes and
        stores the batch again. A lost connection or any other error is raised as ever: the batch is
        read again from its offsets.

        ``counted_back``: the destinations with a breaker (``BREAKERS``); the batch's records come back
        from those (an attempt above 0) are counted in their rows (:mod:`retry_scheduler.core.breakers`).
        """
        if not rows and not chain_events:
            return []
        began, told = time.time(), None
        with self.conn.transaction(), self.conn.cursor() as cur:
            if rows:
                again = self._maybe_stored(cur, rows, consumer_group)
                stored = self._store_rows(cur, rows, again)
                told = notify_overdue(cur, rows)  # the publishers' claims start below them
            else:
                stored = []
            adopted = sorted({row.source_topic for row in rows} & set(adopted_topics))
            if adopted:
                cur.execute(q("mark_adopted_delivered"), {"topics": adopted})
            self._settle_holds(cur, rows, chain_events)
            registered = self._register_destinations(cur, rows)
            if counted_back:
                count_came_back(
                    cur,
                    [
                        (row.destination, row.retry_id)
                        for row in rows
                        # a held record (parked, or a notice) did not fail: it did not come back
                        if row.destination
                        and row.attempt > 0
                        and row.held_by is None
                        and row.destination in counted_back
                    ],
                )
            if offsets:
                keys = sorted(offsets)
                cur.execute(
                    q("save_ingest_offsets"),
                    {
                        "group": consumer_group,
                        "topics": [k[0] for k in keys],
                        "partitions": [k[1] for k in keys],
                        "offsets": [offsets[k] for k in keys],
                    },
                )
        self._registered |= registered  # committed
        if rows and told is None:
            notify_committed_late(self.conn, rows, began)
        return stored

    def _register_destinations(self, cur: psycopg.Cursor[Any], rows: Sequence[CopyRow]) -> set[str]:
        """Record the destinations of ``rows`` this store has not recorded yet in ``retry_destinations``
        (the publishers' lanes, :meth:`claim_lanes`); returns them, to remember once committed."""
        new = {row.destination for row in rows if row.destination} - self._registered
        if new:
            cur.execute(q("register_destinations"), {"destinations": sorted(new)})
        return new

    def _maybe_stored(self, cur: psycopg.Cursor[Any], rows: Sequence[CopyRow], group: str | None) -> bool:
        """Whether some of ``rows`` may be stored already: a partition read from below the next offset
        ``group`` stored with its rows, or one it stored none from (a new group, a renamed one, offsets
        lost). Those batches go through the staging table, which skips records stored already whether
        their job is still in retry_jobs or was published since (migration 0014: the unique key of
        retry_jobs no longer sees those). A batch read on from the stored offsets is COPYed straight
        in. Without a group (jobs stored by hand, as the benchmarks do) only the rows still in
        retry_jobs are found, by their unique key, as before."""
        if group is None:
            return False
        lowest: dict[tuple[str, int], int] = {}
        for row in rows:
            key = (row.source_topic, row.source_partition)
            lowest[key] = min(lowest.get(key, row.source_offset), row.source_offset)
        keys = sorted(lowest)
        cur.execute(
            q("ingest_offsets_of"),
            {"group": group, "topics": [k[0] for k in keys], "partitions": [k[1] for k in keys]},
        )
        stored = {(topic, partition): offset for topic, partition, offset in cur.fetchall()}
        return any(key not in stored or lowest[key] < stored[key] for key in keys)

    def _store_rows(self, cur: psycopg.Cursor[Any], rows: Sequence[CopyRow], again: bool) -> list[str | None]:
        """COPY ``rows``; their dead reasons. When the server refuses rows, find each
        (:meth:`_copy_or_find`) and raise :class:`RowsRefused`: the caller's transaction stores nothing.
        (Refused as a whole but in no part, the parts stay stored: the batch is.)"""
        refusals, stored = self._copy_or_find(cur, rows, 0, again)
        if refusals:
            raise RowsRefused(refusals)
        return stored

    def _copy_or_find(
        self, cur: psycopg.Cursor[Any], rows: Sequence[CopyRow], first: int, again: bool
    ) -> tuple[list[tuple[int, str]], list[str | None]]:
        """COPY ``rows`` in a savepoint (``first``: the index of its first row in the batch); refused,
        halve and try each half the same way. The refused rows (index, the server's error), and the
        dead reasons of the rows stored."""
        try:
            with self.conn.transaction():
                return [], self._copy_rows(cur, rows, again)
        except _ROW_ERRORS as exc:
            if isinstance(exc, psycopg.errors.UniqueViolation):
                raise
            if len(rows) == 1:
                log.warning(
                    "PostgreSQL refused the record %s[%s]@%s: it is stored dead (invalid) with its bytes: %s",
                    rows[0].source_topic, rows[0].source_partition, rows[0].source_offset, refusal_reason(exc),
                )  # fmt: skip
                return [(first, refusal_reason(exc))], []
        half = len(rows) // 2
        found, stored = self._copy_or_find(cur, rows[:half], first, again)
        second_found, second_stored = self._copy_or_find(cur, rows[half:], first + half, again)
        return found + second_found, stored + second_stored

    def _copy_rows(self, cur: psycopg.Cursor[Any], rows: Sequence[CopyRow], again: bool) -> list[str | None]:
        if again:
            stored = self._insert_new_only(cur, rows)
            if len(stored) < len(rows):
                log.info(
                    "%s of %s records were stored already (read again)", len(rows) - len(stored), len(rows)
                )
            return stored
        try:
            with self.conn.transaction(), cur.copy(q("copy_jobs")) as copy:
                copy.set_types(COPY_TYPES)
                for row in rows:
                    copy.write_row(row)
            return [row.dead_reason for row in rows]
        except psycopg.errors.UniqueViolation:
            stored = self._insert_new_only(cur, rows)
            log.info("%s of %s records were stored already (read again)", len(rows) - len(stored), len(rows))
            return stored

    def _settle_holds(
        self,
        cur: psycopg.Cursor[Any],
        rows: Sequence[CopyRow],
        chain_events: Sequence[tuple[str, str, str | None]],
    ) -> None:
        """Ordered mode's part of a batch: each chain's newest state set, 0.4.0's dead blockers found,
        the next held job of each chain it touched due."""
        held = {row.held_by for row in rows if row.held_by is not None}
        dead = {row.retry_id for row in rows if row.dead_reason in _BLOCKER_DEATHS}
        newest = {chain: (state, head) for chain, state, head in chain_events}  # the last of each counts
        self._set_chain_states(cur, newest)
        self._advance_chains(cur, held | dead | set(newest), maybe_dead=held | dead)

    def _set_chain_states(
        self, cur: psycopg.Cursor[Any], states: Mapping[str, tuple[str, str | None]]
    ) -> None:
        """Set each chain's state: ``(released | blocked | dead, the retry.id of the head it waits for or
        that died)``."""
        if states:
            chains = sorted(states)
            cur.execute(
                q("set_chain_states"),
                {
                    "chains": chains,
                    "states": [states[c][0] for c in chains],
                    "heads": [states[c][1] for c in chains],
                },
            )

    def advance_holds(
        self,
        blockers: Collection[str],
        *,
        dead_chains: Mapping[str, str] | None = None,
        dead_ids: Collection[str] = (),
    ) -> int:
        """Make the next held job of each released chain of ``blockers`` due now, unless one is on its
        way; first release as dead the chains whose heads died (``dead_chains``: chain -> the head's
        ``retry.id``) and 0.4.0's chains whose blocker (a ``retry.id`` of ``dead_ids``) died. In the caller's transaction (the
        publisher's, after marking jobs published or dead), once per transaction. Returns how many
        jobs fell due."""
        with self.conn.cursor() as cur:
            dead_chains = dead_chains or {}
            self._set_chain_states(
                cur, {chain: (protocol.CHAIN_DEAD, head) for chain, head in dead_chains.items()}
            )
            return self._advance_chains(
                cur, set(blockers) | set(dead_chains) | set(dead_ids), maybe_dead=set(dead_ids)
            )

    def _advance_chains(self, cur: psycopg.Cursor[Any], blockers: set[str], *, maybe_dead: set[str]) -> int:
        """Release the 0.4.0 chains of the blockers of ``maybe_dead`` that are dead, then let the next
        held job of each released chain of ``blockers`` fall due, under the chains' locks; how many did."""
        if not blockers:
            return 0
        if maybe_dead:
            cur.execute(q("release_dead_blockers"), {"blockers": sorted(maybe_dead)})
        ordered = sorted(blockers)
        cur.execute(q("lock_chains"), {"blockers": ordered})
        cur.execute(q("advance_holds"), {"blockers": ordered, "held_due": HELD_DUE_AT})
        return cur.rowcount

    def forget_released_holds(self, keep_s: float) -> int:
        """Forget the released chains nothing has waited in for ``keep_s`` seconds; how many."""
        with self.conn.transaction():
            return self.conn.execute(q("forget_released_holds"), {"keep_s": keep_s}).rowcount

    def _insert_new_only(self, cur: psycopg.Cursor[Any], rows: Sequence[Sequence[Any]]) -> list[str | None]:
        cur.execute(q("create_stage"))
        with cur.copy(q("copy_stage")) as copy:
            copy.set_types(COPY_TYPES)
            for row in rows:
                copy.write_row(row)
        cur.execute(q("insert_from_stage"))
        return [row[0] for row in cur.fetchall()]

    def database_identity(self) -> str:
        """The database's own id (migration 0027): the same on its replicas, another in a new database."""
        with self.conn.transaction():
            row = self.conn.execute(q("database_identity")).fetchone()
        assert row is not None, "migration 0027 makes the identity row"
        return str(row[0])

    def ingest_offsets(self, consumer_group: str) -> dict[tuple[str, int], int]:
        """The next offset to read of every retry-topic partition ``consumer_group`` stored rows from."""
        with self.conn.transaction():
            rows = self.conn.execute(q("ingest_offsets"), {"group": consumer_group}).fetchall()
        return {(topic, partition): offset for topic, partition, offset in rows}

    def ingested_record_timestamp(self, topic: str, partition: int, offset: int) -> int | None:
        """The timestamp of the record ingested from ``topic[partition]@offset``; None when no row has it."""
        with self.conn.transaction():
            row = self.conn.execute(
                q("ingested_record_timestamp"), {"topic": topic, "partition": partition, "offset": offset}
            ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def _joined(self) -> contextlib.AbstractContextManager[None]:
        """The statements in a transaction of their own, or joining the caller's (:func:`joined`)."""
        return joined(self.conn)

    def _require_transaction(self, what: str) -> None:
        require_transaction(self.conn, what)

    def claim_due(self, limit: int, floor: datetime | None = None) -> list[OutgoingRow]:
        """Lock up to ``limit`` due pending jobs (oldest due first) that no one else holds, of those
        due at or after ``floor`` (None: however old).

        Nothing is written: the row locks last until the caller's transaction ends (``with
        store.conn.transaction():``), and the caller marks the jobs inside it. A publisher that dies
        before its commit loses its locks with its session, and the jobs are due again at once.
        """
        self._require_transaction("claim_due")
        with self._joined():
            # The plan walks the due index in order whatever the statistics say (queries.sql).
            plan = self.conn.execute(q("claim_plan")).fetchone()
            assert plan is not None
            seqscan, bitmapscan, sort, self.claimed_up_to = plan[:4]
            # Binary results: bytea columns come as bytes, not as hex text to decode.
            params = {"limit": limit, "floor": "-infinity" if floor is None else floor}
            rows = self.conn.execute(q("claim_due"), params, binary=True).fetchall()
            self.conn.execute(
                q("claim_plan_reset"), {"seqscan": seqscan, "bitmapscan": bitmapscan, "sort": sort}
            )
        return [OutgoingRow(*row) for row in rows]

    def claim_lanes(
        self, floors: Mapping[str, datetime | None], quota: int
    ) -> tuple[list[OutgoingRow], datetime]:
        """Lock up to ``quota`` due pending jobs of each destination in ``floors`` (oldest due first),
        of those due at or after its floor (None: however old), as :meth:`claim_due` does (in the
        caller's transaction, the same pinned plan). Returns them and when the claim began (the
        server's clock): every job of those destinations due by then was open to it.
        """
        self._require_transaction("claim_lanes")
        names = sorted(floors)
        with self._joined():
            plan = self.conn.execute(q("claim_plan")).fetchone()
            assert plan is not None
            seqscan, bitmapscan, sort, began = plan[:4]
            params = {
                "destinations": names,
                "floors": ["-infinity" if floors[n] is None else floors[n] for n in names],
                "quota": quota,
            }
            rows = self.conn.execute(q("claim_lanes"), params, binary=True).fetchall()
            self.conn.execute(
                q("claim_plan_reset"), {"seqscan": seqscan, "bitmapscan": bitmapscan, "sort": sort}
            )
        return [OutgoingRow(*row) for row in rows], began

    def known_destinations(self) -> list[str]:
        """Every destination a job was stored for (``retry_destinations``)."""
        with self._joined():
            return [row[0] for row in self.conn.execute(q("known_destinations")).fetchall()]

    def claim_dead(self, limit: int, lease_ms: int, worker: str) -> list[OutgoingRow]:
        """Lease dead jobs whose record has not reached the DLQ topic yet."""
        with self.conn.transaction():
            rows = self.conn.execute(
                q("claim_dead"), {"limit": limit, "lease_ms": lease_ms, "worker": worker}
            ).fetchall()
        return [OutgoingRow(*row) for row in rows]

    def limit_idle_transactions(self, timeout_ms: int) -> None:
        """End this session if a transaction stays idle longer than ``timeout_ms`` (a stuck publisher
        then releases the jobs it locked)."""
        with self.conn.transaction():
            self.conn.execute(
                "SELECT set_config('idle_in_transaction_session_timeout', %s, false)", (str(timeout_ms),)
            )

    def _mark(self, query: str, params: dict[str, Any]) -> int:
        with self._joined():
            return self.conn.execute(q(query), params).rowcount

    def mark_published(self, acked: Sequence[tuple[int, int]]) -> int:
        """Mark jobs published; ``acked`` holds ``(job id, acknowledgement time in ms)``. Only in the
        transaction whose :meth:`claim_due` locked them: the statement does not test their status."""
        if not acked:
            return 0
        return self._mark("mark_published", {"ids": [a[0] for a in acked], "acked_ms": [a[1] for a in acked]})

    def mark_dlq_published(self, acked: Sequence[tuple[int, int]]) -> int:
        if not acked:
            return 0
        return self._mark(
            "mark_dlq_published", {"ids": [a[0] for a in acked], "acked_ms": [a[1] for a in acked]}
        )

    def mark_failed(self, failed: Sequence[tuple[int, str]]) -> list[tuple[int, datetime, float]]:
        """Record delivery failures (``(job id, error)``); the jobs become claimable again after a short
        backoff. Returns ``(job id, due time, seconds until its backoff ends)`` of each job marked."""
        if not failed:
            return []
        with self._joined():
            rows = self.conn.execute(
                q("mark_failed"), {"ids": [f[0] for f in failed], "errors": [f[1] for f in failed]}
            ).fetchall()
        return [(int(job_id), due, float(in_s)) for job_id, due, in_s in rows]

    def mark_invalid(self, invalid: Sequence[tuple[int, str]]) -> int:
        """Make pending jobs dead (``invalid``) when publishing showed their headers unusable; ``(id, reason)``.
        Only in the transaction whose :meth:`claim_due` locked them, as :meth:`mark_published`."""
        if not invalid:
            return 0
        return self._mark(
            "mark_invalid", {"ids": [i[0] for i in invalid], "reasons": [i[1] for i in invalid]}
        )

    def vacuum_need(self) -> VacuumNeed:
        """Whether autovacuum covers ``retry_jobs`` (the server's and the table's setting), the
        table's dead and live rows (the server's statistics), and the oldest snapshot another session of
        this database holds (its xmin; None when none, or when this role may not see it)."""
        with self.conn.transaction():
            row = self.conn.execute(q("vacuum_need")).fetchone()
        assert row is not None
        return VacuumNeed(bool(row[0]), int(row[1]), int(row[2]), row[3])

    def seconds_until_next_due(self, after: datetime | None = None) -> float | None:
        """Seconds until the earliest pending job is due (negative when overdue), None if none; with
        ``after`` (:attr:`claimed_up_to` of a claim that was not full), of those due after it only."""
        with self.conn.transaction():
            if after is None:
                row = self.conn.execute(q("next_due")).fetchone()
            else:
                row = self.conn.execute(q("next_due_after"), {"after": after}).fetchone()
        return None if row is None or row[0] is None else row[0].total_seconds()

    def summarize_published(self) -> int | None:
        """Summarize the ``published_at`` BRIN index's new page ranges (see the query); how many, or None
        when it could not now (a VACUUM holds the table, which summarizes them itself; a role that does
        not own the table may not). Never raises for those: the lateness reads only get slower."""
        try:
            with self.conn.transaction():
                self.conn.execute(q("summarize_published_wait"))
                row = self.conn.execute(q("summarize_published")).fetchone()
        except (psycopg.errors.LockNotAvailable, psycopg.errors.InsufficientPrivilege) as exc:
            log.debug("published_at index not summarized now: %s", exc)
            return None
        return int(row[0]) if row is not None else None
