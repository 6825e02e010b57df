"""Browsing the dead letters: a page of them newest first (keyset pagination on ``(dead_at, id)``
and a capped count, so a page stays fast with millions), the filter menus, and one letter shown
whole with its bytes rendered. Read only; the changes (replay, purge) are :mod:`retry_scheduler.ops.dlq`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any

from retry_scheduler.core.config import Settings
from retry_scheduler.core.jobs import decode_headers
from retry_scheduler.db.dead_letters import Database, dead_letters
from retry_scheduler.db.selection import Selection, written_by
from retry_scheduler.ops.dlq import DlqError, dead_only

#: ``count`` stops here: the page shows "10 000+" rather than counting a million rows.
COUNT_CAP = 10_000
#: Longest key, value or header value shown in full; longer ones are cut (the size is shown).
SHOW_BYTES = 4096
#: The most jobs a page lists.
MAX_PAGE = 500


@dataclass(frozen=True)
class DeadJob:
    """A row of the dead-letter list."""

    id: int
    dead_at: datetime
    destination: str | None
    dead_reason: str
    error_class: str | None
    reason: str | None  # first 300 characters
    attempt: int
    policy: str
    retry_id: str
    dlq_topic: str
    dlq_published_at: datetime | None
    first_seen_at: datetime
    value_size: int | None
    #: The topic the letter was read from: a retry topic, or another tool's dead-letter topic.
    source_topic: str = ""
    #: Who wrote it (:func:`written_by`), when the lister knows the deployment.
    written_by: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Page:
    """One page of dead jobs, newest first, and how to get the next one."""

    jobs: list[DeadJob]
    total: int  # capped at COUNT_CAP
    total_capped: bool
    next_cursor: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "jobs": [j.as_json() for j in self.jobs],
            "total": self.total,
            "total_capped": self.total_capped,
            "next_cursor": self.next_cursor,
        }


def _cursor(job: DeadJob) -> str:
    return f"{job.dead_at.isoformat()}_{job.id}"


def _parse_cursor(cursor: str | None) -> tuple[datetime | None, int | None]:
    if not cursor:
        return None, None
    at, _, job_id = cursor.rpartition("_")
    try:
        return datetime.fromisoformat(at), int(job_id)
    except ValueError:
        raise DlqError(f"cursor {cursor!r} is not one this service handed out") from None


def list_dead(
    database_url: Database,
    flt: Selection,
    page_size: int = 50,
    cursor: str | None = None,
    count: bool = True,
    settings: Settings | None = None,
) -> Page:
    """A page of dead jobs matching ``flt``, newest first; ``cursor`` is the previous page's ``next_cursor``.
    With the deployment's ``settings`` each says who wrote it (:func:`written_by`)."""
    if not 1 <= page_size <= MAX_PAGE:
        raise DlqError(f"page size must be 1-{MAX_PAGE}")
    after_at, after_id = _parse_cursor(cursor)
    with dead_letters(database_url) as letters:
        chosen = letters.matching(dead_only(flt))
        rows = letters.page(chosen, after_at=after_at, after_id=after_id, size=page_size + 1)
        total = letters.count(chosen, cap=COUNT_CAP + 1) if count else -1
    jobs = [DeadJob(*row) for row in rows[:page_size]]
    if settings is not None:
        jobs = [replace(job, written_by=written_by(job.source_topic, settings)) for job in jobs]
    more = len(rows) > page_size
    return Page(
        jobs=jobs,
        total=min(total, COUNT_CAP),
        total_capped=total > COUNT_CAP,
        next_cursor=_cursor(jobs[-1]) if more and jobs else None,
    )


def facets(database_url: Database) -> list[dict[str, Any]]:
    """Dead jobs per destination and dead reason, for the filter menus."""
    with dead_letters(database_url) as letters:
        rows = letters.facets()
    return [
        {"destination": destination or None, "dead_reason": reason, "count": n}
        for destination, reason, n in rows
    ]


def render_bytes(data: bytes | memoryview | None, limit: int = SHOW_BYTES) -> dict[str, Any] | None:
    """How to show a key, value or header value: UTF-8 text as text, anything else as hex; cut at ``limit``.

    The text is returned as data (never as markup): the page escapes it.
    """
    if data is None:
        return None
    raw = bytes(data)
    shown = raw[:limit]
    try:
        text = shown.decode("utf-8")
        # Control characters (other than whitespace) mean binary, not text.
        encoding = "utf-8" if all(c.isprintable() or c in "\t\n\r" for c in text) else "hex"
    except UnicodeDecodeError as exc:
        # A multi-byte character cut at the limit is still text.
        if len(raw) > limit and exc.start >= len(shown) - 3:
            text, encoding = shown[: exc.start].decode("utf-8"), "utf-8"
            encoding = encoding if all(c.isprintable() or c in "\t\n\r" for c in text) else "hex"
        else:
            encoding = "hex"
    if encoding == "hex":
        text = shown.hex(" ")
    return {"encoding": encoding, "text": text, "size": len(raw), "truncated": len(raw) > limit}


def show(database_url: Database, job_id: int, limit: int = SHOW_BYTES) -> dict[str, Any]:
    """Every field of one job, with key, value and headers rendered by :func:`render_bytes`."""
    with dead_letters(database_url) as letters:
        job = letters.job(job_id)
    if job is None:
        raise DlqError(f"there is no job {job_id} (purged or compacted, or never stored)")
    out: dict[str, Any] = {
        k: v.isoformat() if isinstance(v, datetime) else v
        for k, v in job.items()
        if k not in ("msg_key", "msg_value", "headers")
    }
    out["key"] = render_bytes(job["msg_key"], limit)
    out["value"] = render_bytes(job["msg_value"], limit)
    out["headers"] = [{"name": n, "value": render_bytes(v, limit)} for n, v in decode_headers(job["headers"])]
    return out
