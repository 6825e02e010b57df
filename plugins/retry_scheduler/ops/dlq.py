"""Dead-letter operations: the filter, replay and purge of dead jobs, each change audited (browsing
them is :mod:`retry_scheduler.ops.browse`).

One implementation behind the three ways in: the ``dlq_replay`` DAG, the Dead letters page of
the Airflow UI (``retry_scheduler.airflow.webui.app``) and ``retry-scheduler dlq``. They share
:class:`DlqFilter`, so a filter means the same everywhere.

- **Replay** makes dead jobs due now; the normal publish loop sends them to their destination
  with ``retry.attempt`` raised (reset to 0 first when asked). Jobs that went dead as
  ``invalid`` are left alone: their headers named no usable destination.
- **Purge** deletes dead jobs whose record is already on the DLQ topic. A dead job whose record
  has not reached the DLQ topic yet exists nowhere else, so it is kept.
- Both work in batches of :data:`BATCH` jobs, one transaction each, so a million-job purge
  neither holds a million row locks nor loses its progress; the audit row of the operation is
  updated in the same transaction as each batch, so its count is exact even after a crash.
- A dry run computes the same selection and writes an audit row, changing nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, LiteralString, NamedTuple

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from retry_scheduler.core import faults, protocol
from retry_scheduler.core.adopt import SERVICE, WRITERS, source_format, topics_of
from retry_scheduler.core.config import Settings
from retry_scheduler.core.destinations import Destinations
from retry_scheduler.core.durations import parse_duration_ms
from retry_scheduler.core.protocol import TOPIC_NAME
from retry_scheduler.core.records import deployment_destinations
from retry_scheduler.db.connection import connect, require_migrated
from retry_scheduler.db.schema import queries
from retry_scheduler.db.store import like_pattern

#: Jobs changed per transaction by replay and purge.
BATCH = 10_000
#: Bounds of a replay or purge's ``limit`` and ``ids``.
MAX_LIMIT = 10_000_000
MAX_IDS = 10_000
#: The most jobs the Dead letters page replays or purges inside one HTTP request; more go through
#: the ``dlq_replay`` DAG (a run with its own log, retries and progress).
MAX_PAGE_ACTION = 10_000

Action = Literal["replay", "purge", "reevaluate"]
Source = Literal["dag", "ui", "cli"]

# The filter's fixed SQL fragments; each applies when its parameter is given.
_FRAGMENTS: dict[str, LiteralString] = {
    "destination": "destination = %(destination)s",
    "dead_reason": "dead_reason = %(dead_reason)s",
    "error_class": "error_class LIKE %(error_class)s ESCAPE '!'",
    # Same expression as the trigram index of migration 0004.
    "search": "(coalesce(reason, '') || ' ' || coalesce(error_class, '')) ILIKE %(search)s ESCAPE '!'",
    "since": "dead_at >= %(since)s",
    "until": "dead_at < %(until)s",
    "ids": "id = ANY(%(ids)s)",
    "source_topics": "source_topic = ANY(%(source_topics)s::text[])",
}


class DlqError(ValueError):
    """A filter or request is invalid, or the job asked for does not exist; the message says which."""


class TooManyForOneRequest(DlqError):
    """An operation would change more jobs than ``max_affected`` allows; nothing was written."""

    def __init__(self, action: Action, would_affect: int, max_affected: int) -> None:
        super().__init__(
            f"{would_affect:,} jobs is more than the {max_affected:,} this page {action}s at "
            "once: trigger the dlq_replay DAG with this filter instead (or narrow the filter)"
        )
        self.action, self.would_affect, self.max_affected = action, would_affect, max_affected


def _time(name: str, value: Any) -> datetime | None:
    """An aware time from ISO-8601, or from a duration meaning that long ago (``"2h"``)."""
    if value in (None, ""):
        return None
    if isinstance(value, datetime):
        parsed = value
    else:
        text = str(value).strip()
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            try:
                return datetime.now(UTC) - timedelta(milliseconds=parse_duration_ms(text))
            except ValueError:
                raise DlqError(
                    f"{name}={value!r} is neither an ISO-8601 time like 2026-11-21T10:00:00Z "
                    "nor a duration ago like 2h"
                ) from None
    if parsed.tzinfo is None:
        raise DlqError(f"{name}={value!r} needs a time zone, e.g. 2026-11-21T10:00:00Z")
    return parsed


def _ids(value: Any) -> tuple[int, ...]:
    if value in (None, "", []):
        return ()
    items = re.split(r"[\s,]+", value.strip()) if isinstance(value, str) else list(value)
    try:
        ids = tuple(sorted({int(i) for i in items if str(i) != ""}))
    except (TypeError, ValueError):
        raise DlqError(f"ids must be job ids (whole numbers), separated by commas: got {value!r}") from None
    if any(i < 1 for i in ids):
        raise DlqError("ids must be positive")
    if len(ids) > MAX_IDS:
        raise DlqError(f"at most {MAX_IDS} ids at once; use a filter for more")
    return ids


#: The most topics a filter names (the letters' writers: the retry topics, the adopted ones).
MAX_SOURCE_TOPICS = 1000


def written_by(source_topic: str, settings: Settings) -> str | None:
    """Who wrote the letter read from ``source_topic``, by the deployment's topics; None when that is
    no topic of it any more (adopted before, say)."""
    if source_topic in settings.adopt_topics:
        return source_format(settings.adopt_topics[source_topic])
    return SERVICE if source_topic == settings.retry_topic or source_topic in settings.delay_topics else None


def writer_topics(writer: str, settings: Settings) -> tuple[str, ...]:
    """The topics the letters ``writer`` (a name of :data:`WRITERS`) wrote are read from: the filter of
    ``--written-by``. Raises :class:`DlqError` for another name, or one no topic is adopted for."""
    if writer not in WRITERS:
        raise DlqError(f"written by must be one of {', '.join(WRITERS)}, not {writer[:40]!r}")
    if writer == SERVICE:
        return (settings.retry_topic, *sorted(settings.delay_topics))
    topics = tuple(topics_of(writer, settings.adopt_topics))
    if not topics:
        raise DlqError(f"no topic of RETRY_ADOPT_TOPICS has the format {writer}: no letter is written by it")
    return topics


@dataclass(frozen=True)
class DlqFilter:
    """Which dead jobs an operation is about. Empty fields do not filter."""

    destination: str | None = None
    dead_reason: str | None = None
    error_class: str | None = None  # glob: * matches anything
    search: str | None = None  # text in the reason or error class, any case
    since: datetime | None = None  # went dead at or after
    until: datetime | None = None  # went dead before
    ids: tuple[int, ...] = ()
    limit: int | None = None  # replay/purge: at most this many, oldest first
    #: read from these topics: who wrote the letters (:func:`writer_topics`)
    source_topics: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.destination is not None and not TOPIC_NAME.fullmatch(self.destination):
            raise DlqError(f"destination {self.destination!r} is not a valid topic name")
        if self.dead_reason is not None and self.dead_reason not in protocol.DEAD_REASONS:
            raise DlqError(
                f"dead reason {self.dead_reason!r} is not one of {', '.join(protocol.DEAD_REASONS)}"
            )
        for name in ("error_class", "search"):
            value = getattr(self, name)
            if value is not None and not (0 < len(value) <= 500 and value.isprintable()):
                raise DlqError(f"{name.replace('_', ' ')} must be 1-500 printable characters")
        if self.since and self.until and self.since >= self.until:
            raise DlqError(
                f"since ({self.since.isoformat()}) must be before until ({self.until.isoformat()})"
            )
        if self.limit is not None and (isinstance(self.limit, bool) or not 1 <= self.limit <= MAX_LIMIT):
            raise DlqError(f"limit must be a whole number from 1 to {MAX_LIMIT:,} (or empty for no limit)")
        if len(self.ids) > MAX_IDS:
            raise DlqError(f"at most {MAX_IDS:,} ids at once: use a filter for more")
        if len(self.source_topics) > MAX_SOURCE_TOPICS or not all(
            TOPIC_NAME.fullmatch(topic) for topic in self.source_topics
        ):
            raise DlqError(f"source topics must be at most {MAX_SOURCE_TOPICS} topic names")

    @classmethod
    def from_params(cls, params: Mapping[str, Any], settings: Settings | None = None) -> DlqFilter:
        """Build from a form, query string or DAG params: strings are trimmed, empty means unset.

        ``written_by`` (a name of :data:`WRITERS`) becomes the topics its letters are read from, by the
        deployment's ``settings`` (:func:`writer_topics`); a list of topics in ``params`` is never taken.
        """

        def text(name: str) -> str | None:
            value = params.get(name)
            return None if value is None or str(value).strip() == "" else str(value).strip()

        limit = params.get("limit")
        try:
            limit_n = None if limit in (None, "", 0, "0") else int(limit)
        except (TypeError, ValueError):
            raise DlqError(f"limit must be a whole number: got {limit!r}") from None
        written_by = text("written_by")
        if written_by is not None and settings is None:
            raise DlqError("written_by needs the deployment's settings to know its topics")
        return cls(
            destination=text("destination"),
            dead_reason=text("dead_reason"),
            error_class=text("error_class"),
            search=text("search"),
            since=_time("since", params.get("since")),
            until=_time("until", params.get("until")),
            ids=_ids(params.get("ids")),
            limit=limit_n,
            source_topics=writer_topics(written_by, settings) if written_by and settings else (),
        )

    def as_dict(self) -> dict[str, Any]:
        """The filter as JSON-friendly values (for the audit row and the API), unset fields left out."""
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if value in (None, ()):
                continue
            out[key] = (
                value.isoformat()
                if isinstance(value, datetime)
                else list(value)
                if key in ("ids", "source_topics")
                else value
            )
        return out

    def where(self) -> tuple[sql.Composable, dict[str, Any]]:
        """The WHERE clause (fixed fragments ANDed) and its parameters."""
        fragments: list[LiteralString] = ["status = 'dead'"]
        params: dict[str, Any] = {}
        values: dict[str, Any] = {
            "destination": self.destination,
            "dead_reason": self.dead_reason,
            "error_class": like_pattern(self.error_class) if self.error_class else None,
            "search": f"%{like_pattern(self.search)}%" if self.search else None,
            "since": self.since,
            "until": self.until,
            "ids": list(self.ids) or None,
            "source_topics": list(self.source_topics) or None,
        }
        for name, value in values.items():
            if value is not None:
                fragments.append(_FRAGMENTS[name])
                params[name] = value
        return sql.SQL(" AND ").join(sql.SQL(f) for f in fragments), params


def dlq_query(name: str, where: sql.Composable) -> sql.Composed:
    """The named statement of ``sql/dlq.sql`` with a filter's WHERE clause in its ``{where}``."""
    return sql.SQL(queries()[name]).format(where=where)


#: Where the operations get their connection: a URL (a connection of their own, checked for the
#: schema), or a pool (the Dead letters page's, checked when it was made).
Database = str | ConnectionPool


@contextmanager
def connection(database: Database) -> Iterator[psycopg.Connection[Any]]:
    """A connection for one operation: the pool's, or a new one checked for the schema."""
    if isinstance(database, ConnectionPool):
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


@dataclass
class Outcome:
    """What a replay or purge did (or, on a dry run, would do)."""

    action: Action
    dry_run: bool
    filter: dict[str, Any]
    matched: int  # dead jobs the filter selected
    would_affect: int  # of those, the ones the action applies to
    affected: int  # changed (0 on a dry run)
    skipped: dict[str, int] = field(default_factory=dict)  # selected but left alone, by cause
    audit_id: int | None = None
    reset_attempts: bool = False

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        verb = {"replay": "replayed", "purge": "purged", "reevaluate": "re-evaluated and made pending"}[
            self.action
        ]
        left = "; ".join(f"{n} {cause}" for cause, n in self.skipped.items() if n)
        head = (
            f"dry run: {self.would_affect} of {self.matched} selected dead jobs would be {verb}"
            if self.dry_run
            else f"{self.affected} of {self.matched} selected dead jobs {verb}"
        )
        return head + (f" (left alone: {left})" if left else "") + f" [audit {self.audit_id}]"


class Plan(NamedTuple):
    """What a replay or purge of a filter would do (``dlq_plan``): the jobs it selects, and of those
    the ones it would leave alone, by why."""

    matched: int
    invalid: int  # no usable destination
    not_on_dlq: int  # not yet published to their DLQ topic
    in_flight: int  # being sent to their DLQ topic right now (leased)
    refused: int  # of a destination the rules no longer allow

    def skipped(self, action: Action) -> dict[str, int]:
        """The jobs ``action`` would leave alone, by why (in the words the outcome and audit use)."""
        if action == "replay":
            return {
                "invalid, no usable destination": self.invalid,
                "being sent to the DLQ topic now": self.in_flight,
                "destination not allowed": self.refused,
            }
        return {"not yet on the DLQ topic": self.not_on_dlq}


def run_action(
    database_url: Database,
    action: Action,
    flt: DlqFilter,
    *,
    actor: str,
    source: Source,
    dry_run: bool,
    reset_attempts: bool = False,
    run_id: str | None = None,
    progress: Callable[[int, int], None] = lambda done, total: None,
    destinations: Destinations | None = None,
    max_affected: int | None = None,
    batch_size: int = BATCH,
) -> Outcome:
    """Replay or purge the dead jobs of ``flt`` (dry run: only count), writing one audit row.

    A replay leaves dead the jobs whose destination ``destinations`` (default: the deployment's
    rules from the environment, :func:`deployment_destinations`) no longer allows, counted under
    ``skipped``. ``progress(done, total)`` is called after each batch. With ``max_affected``, an
    operation (not a dry run) that would affect more jobs is refused before anything is written
    (:class:`TooManyForOneRequest`).
    ``batch_size`` jobs change per transaction (:data:`BATCH` by default).
    """
    if not 1 <= batch_size <= MAX_LIMIT:
        raise DlqError(f"batch size {batch_size} must be between 1 and {MAX_LIMIT:,}")
    if action not in ("replay", "purge"):
        raise DlqError(f"action {action!r} must be replay or purge")
    if not actor:
        raise DlqError("an operation needs an actor (who asked for it) for the audit")
    where, params = flt.where()
    with connection(database_url) as conn:
        if flt.limit is not None:
            # Fix the limited selection first, so the batches cannot drift to other jobs.
            with conn.transaction():
                got = conn.execute(
                    dlq_query("dlq_selected_ids", where), {**params, "limit": flt.limit}
                ).fetchone()
            ids = tuple(got[0] or []) if got else ()
            if ids:  # when nothing matched, the filter stays as it is and the plan below counts 0
                where, params = DlqFilter(ids=ids).where()
        refused: list[str] = []
        if action == "replay":
            rules = destinations or deployment_destinations()
            with conn.transaction():
                targets = conn.execute(
                    dlq_query("dlq_plan_destinations", where), {**params, "limit": flt.limit}
                ).fetchall()
            refused = sorted(t for (t,) in targets if not rules.allows(t))
        with conn.transaction():
            plan_row = conn.execute(
                dlq_query("dlq_plan", where), {**params, "limit": flt.limit, "refused": refused}
            ).fetchone()
        assert plan_row is not None
        plan = Plan(*(int(n) for n in plan_row))
        skipped = plan.skipped(action)
        outcome = Outcome(
            action=action,
            dry_run=dry_run,
            filter=flt.as_dict(),
            matched=plan.matched,
            would_affect=max(0, plan.matched - sum(skipped.values())),
            affected=0,
            skipped=skipped,
            reset_attempts=reset_attempts,
        )
        if not dry_run and max_affected is not None and outcome.would_affect > max_affected:
            raise TooManyForOneRequest(action, outcome.would_affect, max_affected)
        with conn.transaction():
            audit = conn.execute(
                sql.SQL(queries()["dlq_audit_start"]),
                {
                    "action": action,
                    "dry_run": dry_run,
                    "actor": actor,
                    "source": source,
                    "run_id": run_id,
                    "filter": Jsonb(outcome.filter),
                    "reset_attempts": reset_attempts,
                    "matched": outcome.matched,
                    "skipped": Jsonb({k: v for k, v in skipped.items() if v}),
                },
            ).fetchone()
        assert audit is not None
        outcome.audit_id = int(audit[0])
        if not dry_run and outcome.matched:
            batch_query = dlq_query("dlq_replay_batch" if action == "replay" else "dlq_purge_batch", where)
            after_id = 0
            while True:
                with conn.transaction():
                    done = [
                        r[0]
                        for r in conn.execute(
                            batch_query,
                            {
                                **params,
                                "after_id": after_id,
                                "batch": batch_size,
                                "reset_attempts": reset_attempts,
                                "refused": refused,
                            },
                        ).fetchall()
                    ]
                    if done:
                        conn.execute(
                            sql.SQL(queries()["dlq_audit_progress"]),
                            {"affected": len(done), "audit_id": outcome.audit_id},
                        )
                        faults.checkpoint("dlq.batch")  # chaos: die before this batch commits
                if not done:
                    break
                outcome.affected += len(done)
                after_id = max(done)
                progress(outcome.affected, outcome.would_affect)
        with conn.transaction():
            conn.execute(sql.SQL(queries()["dlq_audit_finish"]), {"audit_id": outcome.audit_id})
    return outcome


def recent_audit(database_url: Database, limit: int = 20) -> list[dict[str, Any]]:
    """The latest audit rows, newest first."""
    return _audit_rows(database_url, "dlq_audit_recent", {"limit": limit})


def audit_of_run(database_url: Database, run_id: str, action: str) -> dict[str, Any] | None:
    """The audit row of an Airflow run's ``action`` (``replay``, ``bulk_replay``...): its latest one."""
    rows = _audit_rows(database_url, "dlq_audit_of_run", {"run_id": run_id, "action": action})
    return rows[0] if rows else None


def _audit_rows(database_url: Database, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with connection(database_url) as conn:
        cur = conn.execute(sql.SQL(queries()[query]), params)
        names = [d.name for d in cur.description or []]
        rows = cur.fetchall()
    return [
        {k: v.isoformat() if isinstance(v, datetime) else v for k, v in zip(names, row, strict=True)}
        for row in rows
    ]


def to_json(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)
