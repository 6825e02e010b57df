"""Which jobs an operation is about: one selection for every way of choosing jobs.

The DLQ commands (``retry-scheduler dlq``), the Dead letters page, the ``dlq_replay`` and
``retry_bulk_replay`` forms, ``retry-scheduler bulk-retry`` and the Spark bulk retry job all build a
:class:`Selection` with :meth:`Selection.from_params` and the same option names, so a filter means
the same everywhere. It is rendered as parameterised SQL (:meth:`Selection.where`) for psycopg, and
with every value quoted as a literal (:meth:`Selection.jdbc_where`) for a Spark JDBC subquery, which
takes no bind parameters. Every value is checked when the selection is made.

``since`` and ``until`` select by when a job last failed: when it went dead for a dead job, when its
retry was stored for a pending one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, LiteralString

from psycopg import sql

from retry_scheduler.core import protocol
from retry_scheduler.core.adopt import SERVICE, WRITERS, source_format, topics_of
from retry_scheduler.core.config import Settings
from retry_scheduler.core.durations import time_or_ago
from retry_scheduler.core.jobs import Status
from retry_scheduler.core.protocol import TOPIC_NAME

#: The statuses a selection can choose: dead jobs (every path) and pending ones (the bulk retry).
SELECTABLE = (Status.DEAD, Status.PENDING)
#: SQL of a job row's payload in bytes: key, value and pass-through headers (what sizes the Spark
#: jobs' JDBC fetches).
PAYLOAD_BYTES_SQL: LiteralString = (
    "coalesce(octet_length(msg_key), 0) + coalesce(octet_length(msg_value), 0) "
    "+ coalesce(octet_length(headers), 0)"
)
#: Bounds of ``limit``, ``ids`` and ``source_topics``.
MAX_LIMIT = 10_000_000
MAX_IDS = 10_000
MAX_SOURCE_TOPICS = 1000
#: The longest glob or search text.
MAX_TEXT = 500

# The fixed SQL fragments; each applies when its value is given. ``since`` and ``until`` compare
# with the column of :data:`_FAILED_AT`.
_FRAGMENTS: dict[str, LiteralString] = {
    "destination": "destination = %(destination)s",
    "dead_reason": "dead_reason = %(dead_reason)s",
    "error_class": "error_class LIKE %(error_class)s ESCAPE '!'",
    # Same expression as the trigram index of migration 0004.
    "search": "(coalesce(reason, '') || ' ' || coalesce(error_class, '')) ILIKE %(search)s ESCAPE '!'",
    "ids": "id = ANY(%(ids)s::bigint[])",
    "source_topics": "source_topic = ANY(%(source_topics)s::text[])",
}
#: The status as a literal (the partial indexes of dead and pending jobs name it so).
_STATUS: dict[Status, LiteralString] = {Status.DEAD: "status = 'dead'", Status.PENDING: "status = 'pending'"}
#: When a job last failed: it went dead, or its retry was stored.
_FAILED_AT: dict[Status, tuple[LiteralString, LiteralString]] = {
    Status.DEAD: ("dead_at >= %(since)s::timestamptz", "dead_at < %(until)s::timestamptz"),
    Status.PENDING: ("created_at >= %(since)s::timestamptz", "created_at < %(until)s::timestamptz"),
}
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


#: ``!`` escapes LIKE wildcards: unlike a backslash it means the same with any standard_conforming_strings.
LIKE_ESCAPE = "!"


def like_pattern(glob: str) -> str:
    """Translate a ``*`` glob into a LIKE pattern (escape ``!``): ``%`` and ``_`` match themselves."""
    escaped = "".join(LIKE_ESCAPE + c if c in f"%_{LIKE_ESCAPE}" else c for c in glob)
    return escaped.replace("*", "%")


class SelectionError(ValueError):
    """A selection's value is invalid; the message says which and what to give."""


def parse_time(name: str, value: Any, *, naive_is_utc: bool = False) -> datetime | None:
    """An aware time from ISO-8601, or from a duration meaning that long ago (``"2h"``).

    A time without a zone is refused unless ``naive_is_utc`` (command lines take it as UTC)."""
    if value in (None, ""):
        return None
    if isinstance(value, datetime):
        parsed = value
    else:
        try:
            parsed = time_or_ago(str(value))
        except (ValueError, OverflowError):
            raise SelectionError(
                f"{name}={str(value)[:60]!r} is neither an ISO-8601 time like 2026-11-21T10:00:00Z "
                "nor a duration ago like 2h"
            ) from None
    if parsed.tzinfo is None:
        if not naive_is_utc:
            raise SelectionError(f"{name}={value!r} needs a time zone, e.g. 2026-11-21T10:00:00Z")
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def _items(value: Any) -> list[Any]:
    """The items of a list, or of a text of items separated by commas or spaces; none for empty."""
    if value in (None, "", [], ()):
        return []
    items = re.split(r"[\s,]+", value.strip()) if isinstance(value, str) else list(value)
    return [i for i in items if str(i) != ""]


def parse_ids(value: Any) -> tuple[int, ...]:
    """Job ids from a list or a text of ids separated by commas or spaces, sorted and distinct."""
    try:
        ids = tuple(sorted({int(i) for i in _items(value)}))
    except (TypeError, ValueError):
        raise SelectionError(
            f"ids must be job ids (whole numbers), separated by commas: got {str(value)[:60]!r}"
        ) from None
    if any(i < 1 for i in ids):
        raise SelectionError("ids must be positive")
    return ids


def _limit(value: Any) -> int | None:
    if value in (None, "", 0, "0"):
        return None
    if isinstance(value, bool):
        raise SelectionError(f"limit must be a whole number: got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise SelectionError(f"limit must be a whole number: got {str(value)[:60]!r}") from None


def source_topics(value: Any) -> tuple[str, ...]:
    """Topic names given as a list or a comma-separated text."""
    return tuple(str(i) for i in _items(value))


def written_by(source_topic: str, settings: Settings) -> str | None:
    """Who wrote the letter read from ``source_topic``, by the deployment's topics; None when that is
    no topic of it any more (adopted before, say)."""
    if source_topic in settings.adopt_topics:
        return source_format(settings.adopt_topics[source_topic])
    return SERVICE if source_topic == settings.retry_topic or source_topic in settings.delay_topics else None


def writer_topics(writer: str, settings: Settings) -> tuple[str, ...]:
    """The topics the letters ``writer`` (a name of :data:`WRITERS`) wrote are read from: the filter of
    ``written_by``. Raises ValueError for another name, or one no topic is adopted for."""
    if writer not in WRITERS:
        raise ValueError(f"written by must be one of {', '.join(WRITERS)}, not {writer[:40]!r}")
    if writer == SERVICE:
        return (settings.retry_topic, *sorted(settings.delay_topics))
    topics = tuple(topics_of(writer, settings.adopt_topics))
    if not topics:
        raise ValueError(
            f"no topic of RETRY_ADOPT_TOPICS has the format {writer}: no letter is written by it"
        )
    return topics


@dataclass(frozen=True)
class Selection:
    """Which jobs: dead ones by default. Empty fields do not filter; every value is checked here."""

    status: Status = Status.DEAD
    destination: str | None = None
    dead_reason: str | None = None
    #: Glob on the error class: ``*`` matches anything, every other character itself.
    error_class: str | None = None
    #: Text in the reason or the error class, any case.
    search: str | None = None
    #: Last failed at or after / before: went dead (dead jobs), was stored (pending jobs).
    since: datetime | None = None
    until: datetime | None = None
    ids: tuple[int, ...] = ()
    #: At most this many, the first by id (the oldest first).
    limit: int | None = None
    #: Read from these topics: who wrote the letters (``written_by``, :func:`writer_topics`).
    source_topics: tuple[str, ...] = ()
    #: Destinations left out (those the destination rules no longer allow, for the bulk retry).
    excluded: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.status not in SELECTABLE:
            raise SelectionError(f"status {str(self.status)!r} must be dead or pending")
        object.__setattr__(self, "status", Status(self.status))  # "dead" given as text: the member
        if self.destination is not None and not TOPIC_NAME.fullmatch(self.destination):
            raise SelectionError(
                f"destination {self.destination[:300]!r} is not a valid topic name ([A-Za-z0-9._-], "
                "1-249 characters)"
            )
        if self.dead_reason is not None:
            if self.dead_reason not in protocol.DEAD_REASONS:
                raise SelectionError(
                    f"dead reason {self.dead_reason[:60]!r} is not one of {', '.join(protocol.DEAD_REASONS)}"
                )
            if self.status is not Status.DEAD:
                raise SelectionError("a dead reason selects dead jobs: leave it out for pending ones")
        for name in ("error_class", "search"):
            value = getattr(self, name)
            if value is not None and not (0 < len(value) <= MAX_TEXT and value.isprintable()):
                raise SelectionError(f"{name.replace('_', ' ')} must be 1-{MAX_TEXT} printable characters")
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise SelectionError(f"{name} needs a time zone")
        if self.since and self.until and self.since >= self.until:
            raise SelectionError(
                f"since ({self.since.isoformat()}) must be before until ({self.until.isoformat()})"
            )
        if self.limit is not None and (isinstance(self.limit, bool) or not 1 <= self.limit <= MAX_LIMIT):
            raise SelectionError(
                f"limit must be a whole number from 1 to {MAX_LIMIT:,} (or empty for no limit)"
            )
        if len(self.ids) > MAX_IDS:
            raise SelectionError(f"at most {MAX_IDS:,} ids at once: use a filter for more")
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 1 for i in self.ids):
            raise SelectionError("ids must be positive whole numbers")
        for name in ("source_topics", "excluded"):
            topics = getattr(self, name)
            if len(topics) > MAX_SOURCE_TOPICS or not all(TOPIC_NAME.fullmatch(t) for t in topics):
                raise SelectionError(
                    f"{name.replace('_', ' ')} must be at most {MAX_SOURCE_TOPICS} topic names"
                )

    @classmethod
    def from_params(
        cls, params: Mapping[str, Any], settings: Settings | None = None, *, naive_is_utc: bool = False
    ) -> Selection:
        """Build from a form, a query string, DAG params or a command line's options: strings are
        trimmed, empty means unset.

        ``written_by`` (a name of :data:`~retry_scheduler.core.adopt.WRITERS`) becomes the topics its
        letters are read from, by the deployment's ``settings``; a list of topics in ``params`` is
        never taken (only a job's ``--source-topics``, written by its submitter: :func:`selection_from_args`). ``naive_is_utc``: a time without a zone is UTC (command
        lines) rather than refused (forms).
        """

        def text(name: str) -> str | None:
            value = params.get(name)
            return None if value is None or str(value).strip() == "" else str(value).strip()

        status = text("status") or Status.DEAD.value
        if status not in {s.value for s in SELECTABLE}:
            raise SelectionError(f"status {status[:40]!r} must be dead or pending")
        written_by = text("written_by")
        if written_by is not None and settings is None:
            raise SelectionError("written_by needs the deployment's settings to know its topics")
        try:
            topics = writer_topics(written_by, settings) if written_by and settings else ()
        except ValueError as exc:
            raise SelectionError(str(exc)) from None
        return cls(
            status=Status(status),
            destination=text("destination"),
            dead_reason=text("dead_reason"),
            error_class=text("error_class"),
            search=text("search"),
            since=parse_time("since", params.get("since"), naive_is_utc=naive_is_utc),
            until=parse_time("until", params.get("until"), naive_is_utc=naive_is_utc),
            ids=parse_ids(params.get("ids")),
            limit=_limit(params.get("limit")),
            source_topics=topics,
        )

    def as_dict(self) -> dict[str, Any]:
        """The selection as JSON-friendly values (for audit rows and the API): given fields only, the
        status only when it is not the default (dead)."""
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if value in (None, ()) or (key == "status" and value is Status.DEAD):
                continue
            out[key] = (
                value.isoformat()
                if isinstance(value, datetime)
                else list(value)
                if isinstance(value, tuple)
                else str(value)
                if isinstance(value, Status)
                else value
            )
        return out

    def as_args(self) -> list[str]:
        """The selection as a job's command line options (:func:`add_selection_arguments`, with
        ``for_job``): what :meth:`from_params` reads back to the same selection."""
        args = ["--destination", self.destination] if self.destination is not None else []
        args += ["--status", str(self.status)]
        for name in ("dead_reason", "error_class", "search"):
            value = getattr(self, name)
            if value is not None:
                args += [f"--{name.replace('_', '-')}", value]
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None:
                args += [f"--{name}", value.isoformat()]
        if self.ids:
            args += ["--ids", ",".join(map(str, self.ids))]
        if self.limit is not None:
            args += ["--limit", str(self.limit)]
        if self.source_topics:
            args += ["--source-topics", ",".join(self.source_topics)]
        return args

    def conditions(self) -> tuple[list[LiteralString], dict[str, Any]]:
        """The WHERE clause as fixed fragments with ``%(name)s`` placeholders, and their values."""
        fragments: list[LiteralString] = [_STATUS[self.status]]
        params: dict[str, Any] = {}
        values: dict[str, Any] = {
            "destination": self.destination,
            "dead_reason": self.dead_reason,
            "error_class": like_pattern(self.error_class) if self.error_class else None,
            "search": f"%{like_pattern(self.search)}%" if self.search else None,
            "ids": list(self.ids) or None,
            "source_topics": list(self.source_topics) or None,
        }
        for name, value in values.items():
            if value is not None:
                fragments.append(_FRAGMENTS[name])
                params[name] = value
        since, until = _FAILED_AT[self.status]
        if self.since is not None:
            fragments.append(since)
            params["since"] = self.since
        if self.until is not None:
            fragments.append(until)
            params["until"] = self.until
        if self.excluded:
            fragments.append("destination <> ALL(%(excluded)s::text[])")
            params["excluded"] = list(self.excluded)
        return fragments, params

    def where(self, *extra: LiteralString) -> tuple[sql.Composable, dict[str, Any]]:
        """The WHERE clause for psycopg (fixed fragments, and ``extra`` ones, ANDed) and its values."""
        fragments, params = self.conditions()
        return sql.SQL(" AND ").join(sql.SQL(f) for f in (*fragments, *extra)), params

    def jdbc_where(self, *extra: LiteralString, **values: int) -> str:
        """The WHERE clause with every value a quoted literal (:func:`sql_literal`), for a JDBC
        ``dbtable`` subquery; ``extra`` fragments may use ``values`` (whole numbers)."""
        fragments, params = self.conditions()
        params |= {name: int(value) for name, value in values.items()}
        return " AND ".join(inline(f, params) for f in (*fragments, *extra))


def sql_literal(value: object) -> str:
    """Render a value of a :class:`Selection` as a SQL literal, for JDBC options.

    JDBC options cannot take bind parameters. Strings become ``E''`` literals (backslashes and
    quotes doubled), which read the same whatever ``standard_conforming_strings`` says; lists become
    arrays of such literals.
    """
    if isinstance(value, bool):
        raise TypeError("booleans are not selection values")
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, datetime):
        rendered = value.astimezone(UTC).isoformat()
        if not re.fullmatch(r"[0-9T:.+-]+", rendered):  # belt and braces: it is our own rendering
            raise ValueError(f"unexpected timestamp rendering {rendered!r}")
        return f"'{rendered}'"
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("NUL characters cannot be part of a filter")
        return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(sql_literal(v) for v in value) + "]"
    raise TypeError(f"cannot render {type(value).__name__} as a SQL literal")


def inline(fragment: str, params: Mapping[str, object]) -> str:
    """Replace the ``%(name)s`` placeholders of a fixed fragment with literals of ``params``."""
    return _PLACEHOLDER.sub(lambda m: sql_literal(params[m.group(1)]), fragment)
