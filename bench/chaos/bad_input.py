"""The bad-input corpus: each kind must end dead with a reason naming its fault, and never stop the service."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.chaos.common import KIND_HEADER, Header
from bench.chaos.stack import ChaosStack, Supervisor, Worker, worker_env
from bench.chaos.topics import (
    PERMISSIVE_TOPIC_CONFIG,
    Seen,
    Topics,
    create_topics,
    read_topics,
    send,
    wait_done,
)
from retry_scheduler.core import protocol as p
from retry_scheduler.core.jobs import decode_headers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BadInput:
    """One kind of bad record: its retry headers, and what its dead reason must say.

    ``outcome="published"`` marks inputs that look suspicious but are valid by the protocol (a null
    key and value is a tombstone): they must come back unchanged, not die.
    """

    kind: str
    headers: Sequence[Header]
    expect: str
    key: bytes | None = b"k"
    value: bytes | None = b"v"
    outcome: str = p.DEAD_INVALID
    #: The record's own timestamp (epoch ms; 0: the producer's clock).
    timestamp: int = 0


def bad_inputs(topics: Topics, max_record_bytes: int) -> list[BadInput]:
    """The corpus: malformed, oversized, badly encoded and disallowed retry headers, floods, empties."""
    dest = topics.dest.encode()
    to: list[Header] = [(p.DESTINATION, dest)]
    now_ms = int(time.time() * 1000)
    week_ahead = now_ms + 7 * 86_400_000

    def h(name: str, value: bytes | str | None) -> Header:
        return (name, value.encode() if isinstance(value, str) else value)

    def range_fault(name: str, value: str) -> BadInput:
        return BadInput(
            f"{name.removeprefix('retry.')}={value[:20]}",
            [*to, h(name, value)],
            f"header {name}={value} is out of range",
        )

    def int_fault(kind: str, name: str, value: str) -> BadInput:
        return BadInput(kind, [*to, h(name, value)], f"header {name}={value[:40]!r} is not an integer")

    def not_allowed(kind: str, destination: str, name: str = p.DESTINATION) -> BadInput:
        return BadInput(kind, [h(name, destination)], f"destination {destination!r} is not allowed")

    def missing_partition(n: str) -> BadInput:
        # Valid as a number; only publishing finds that the destination (3 partitions) lacks it.
        return BadInput(
            f"partition {n} of a 3-partition topic",
            [(p.ORIGINAL_TOPIC, dest), h(p.ORIGINAL_PARTITION, n)],
            f"header {p.ORIGINAL_PARTITION}={n}: topic {topics.dest} has no such partition",
        )

    corpus = [
        BadInput("no retry headers", [], "no destination"),
        BadInput("attempt but no destination", [h(p.ATTEMPT, "1")], "no destination"),
        BadInput("empty destination", [h(p.DESTINATION, "")], "no destination"),
        BadInput("destination header in the wrong case", [("Retry.Destination", dest)], "no destination"),
        BadInput("null destination", [h(p.DESTINATION, None)], f"header {p.DESTINATION} is null"),
        BadInput("null attempt", [*to, h(p.ATTEMPT, None)], f"header {p.ATTEMPT} is null"),
        not_allowed("destination _internal", "_internal"),
        not_allowed("destination __consumer_offsets", "__consumer_offsets"),
        not_allowed("original topic __transaction_state", "__transaction_state", p.ORIGINAL_TOPIC),
        not_allowed("destination retry", "retry"),
        not_allowed("destination retry.dlq", "retry.dlq"),
        not_allowed("destination is the retry topic", topics.retry),
        not_allowed("destination is the DLQ topic", topics.dlq),
        not_allowed("destination with a space", "orders topic"),
        not_allowed("destination with a newline", topics.dest + "\n"),
        not_allowed("destination of 250 characters", "d" * 250),
        BadInput("destination header of 2000 bytes", [h(p.DESTINATION, "d" * 2000)], f"header {p.DESTINATION} is 2000 bytes"),
        int_fault("attempt not a number", p.ATTEMPT, "abc"),
        int_fault("attempt with a fraction", p.ATTEMPT, "1.5"),
        int_fault("attempt in Arabic-Indic digits", p.ATTEMPT, "\u0661\u0662"),
        range_fault(p.ATTEMPT, "-1"),
        range_fault(p.ATTEMPT, "99999999999999999999"),
        range_fault(p.AT, "99999999999999999"),
        range_fault(p.AT, "-5"),
        int_fault("retry.at of 40 digits", p.AT, "9" * 40),
        int_fault("retry.at empty", p.AT, ""),
        int_fault("retry.at as an ISO date", p.AT, "2026-01-01T00:00:00Z"),
        int_fault("partition not a number", p.ORIGINAL_PARTITION, "x"),
        range_fault(p.ORIGINAL_PARTITION, "-3"),
        range_fault(p.ORIGINAL_PARTITION, "4294967296"),
        missing_partition("7"),
        missing_partition("2147483647"),
        range_fault(p.ORIGINAL_OFFSET, "-1"),
        int_fault("original timestamp in scientific notation", p.ORIGINAL_TIMESTAMP, "1e12"),
        range_fault(p.ORIGINAL_TIMESTAMP, "99999999999999999"),
        BadInput("unknown send-to", [*to, h(p.SEND_TO, "later")], f"header {p.SEND_TO}='later' must be 'retry' or 'dlq'"),
        BadInput("unknown policy", [*to, h(p.POLICY, "nope")], "unknown policy 'nope'"),
        BadInput("policy header of 2000 bytes", [*to, h(p.POLICY, "p" * 2000)], f"header {p.POLICY} is 2000 bytes"),
        BadInput("retry.id of 2000 bytes", [*to, h(p.ID, "i" * 2000)], f"header {p.ID} is 2000 bytes"),
        # A repeated retry header counts by its last occurrence (as Java's lastHeader reads it):
        BadInput("destination twice, the last not allowed", [*to, h(p.DESTINATION, "other")],
                 "destination 'other' is not allowed"),
        BadInput("attempt twice, the last malformed", [*to, h(p.ATTEMPT, "1"), h(p.ATTEMPT, "x")],
                 f"header {p.ATTEMPT}='x' is not an integer"),
        BadInput("attempt twice (a copied record's headers)", [*to, h(p.ATTEMPT, "x"), h(p.ATTEMPT, "1")], "",
                 outcome="published"),
        BadInput("flood of 10000 headers", [*to, *[("flood", b"x")] * 9998], "record has 10000 headers, more than the 256 allowed"),
        BadInput("value over RETRY_MAX_RECORD_BYTES", to, f"more than the {max_record_bytes} allowed",
                 value=b"x" * (max_record_bytes + 1)),
        BadInput("header over RETRY_MAX_RECORD_BYTES", [*to, ("blob", b"b" * (max_record_bytes + 1))],
                 f"more than the {max_record_bytes} allowed"),
        BadInput("null key and value, no destination", [], "no destination", key=None, value=None),
        BadInput("empty key and value, bad attempt", [*to, h(p.ATTEMPT, "x")], f"header {p.ATTEMPT}='x' is not an integer",
                 key=b"", value=b""),
        BadInput("header name of 70000 characters", [*to, ("n" * 70_000, b"x")],
                 "a header name is 70000 characters long, more than the 1024 allowed"),
        BadInput("retry.at in the year 3000", [*to, h(p.AT, "32503680000000")],
                 f"header {p.AT}=32503680000000 is more than 366d ahead"),
        BadInput("original timestamp a week ahead", [*to, h(p.ORIGINAL_TIMESTAMP, str(week_ahead))],
                 f"header {p.ORIGINAL_TIMESTAMP}={week_ahead} is more than 1d in the future"),
        # Valid records with a record timestamp no clock gives: the ingest time counts, they come back.
        BadInput("record timestamp in nanoseconds", list(to), "", outcome="published", timestamp=now_ms * 1_000_000),
        BadInput("record timestamp in microseconds", list(to), "", outcome="published", timestamp=now_ms * 1000),
        BadInput("record timestamp in seconds", list(to), "", outcome="published", timestamp=now_ms // 1000),
        BadInput("null key and value (a tombstone)", list(to), "", key=None, value=None, outcome="published"),
        BadInput("empty key and value", list(to), "", key=b"", value=b"", outcome="published"),
    ]  # fmt: skip
    for name in sorted(p.KNOWN):
        others = [] if name in (p.DESTINATION, p.ORIGINAL_TOPIC) else to
        corpus.append(
            BadInput(
                f"bad UTF-8 in {name}", [*others, (name, b"ab\xff\xfe")], f"header {name} is not valid UTF-8"
            )
        )
        # A NUL byte is valid UTF-8 that no PostgreSQL text holds: once, it failed the whole batch's COPY.
        nul = dest[:1] + b"\x00" + dest[1:] if name in (p.DESTINATION, p.ORIGINAL_TOPIC) else b"1\x00"
        corpus.append(
            BadInput(
                f"NUL byte in {name}",
                [*others, (name, nul)],
                f"header {name} contains a NUL byte",
            )
        )
    return corpus


@dataclass
class BadInputResult:
    kinds: int
    lost: int
    same_ingest_process: bool
    good_record_after: bool
    seconds: float
    outcomes: list[dict[str, Any]]

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.same_ingest_process and self.good_record_after


def _bad_input_outcome(
    bad: BadInput, rows: dict[str, dict[str, Any]], dest: list[Seen], dlq: list[Seen]
) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": bad.kind, "expected": bad.outcome, "ok": False}
    if bad.outcome == "published":
        copies = [s for s in dest if s.header(KIND_HEADER) == bad.kind]
        out["ok"] = len(copies) == 1 and (copies[0].key, copies[0].value) == (bad.key, bad.value)
        out["outcome"] = "published" if copies else "missing"
        return out
    row, copies = rows.get(bad.kind), [s for s in dlq if s.header(KIND_HEADER) == bad.kind]
    out["reason"] = row["reason"] if row else None
    out["outcome"] = f"{row['status']} ({row['dead_reason']})" if row else "no job"
    if row is None or not copies:
        out["problem"] = (
            "no job in PostgreSQL"
            if row is None
            else f"not on the DLQ topic (last error: {row['last_error']})"
        )
        return out
    text = copies[0].header(p.REASON) or ""
    checks = {
        "dead invalid in PostgreSQL": (row["status"], row["dead_reason"]) == ("dead", bad.outcome),
        "reason names the fault": bad.expect in (row["reason"] or "") and bad.expect in text,
        "dead reason on the DLQ": copies[0].header(p.DEAD_REASON) == bad.outcome,
        "key and value unchanged": (copies[0].key, copies[0].value) == (bad.key, bad.value),
        "once on the DLQ": len(copies) == 1,
    }
    failed = [name for name, passed in checks.items() if not passed]
    out["ok"] = not failed
    if failed:
        out["problem"] = ", ".join(failed)
    return out


def run_bad_input(
    stack: ChaosStack, timeout_s: float = 90, max_record_bytes: int = 1024 * 1024
) -> BadInputResult:
    """Send the corpus to a running service, then a good record; account for every one."""
    import psycopg
    from psycopg.rows import dict_row

    began = time.monotonic()
    topics = Topics("bad")
    database_url = stack.create_database("chaos_bad_input")
    create_topics(stack.bootstrap, topics.all, config=PERMISSIVE_TOPIC_CONFIG)
    corpus = bad_inputs(topics, max_record_bytes)
    env = worker_env(stack, database_url, topics, RETRY_MAX_RECORD_BYTES=str(max_record_bytes))
    logs = stack.work_dir / "logs"
    logs.mkdir(exist_ok=True)
    workers = [Worker(kind, env, logs / f"bad-input-{kind}.log") for kind in ("ingest", "publish")]
    records = [
        {
            "key": bad.key,
            "value": bad.value,
            "headers": [(KIND_HEADER, bad.kind.encode()), *bad.headers],
            "timestamp": bad.timestamp,
        }
        for bad in corpus
    ]
    good = {
        "key": b"good",
        "value": b"after the corpus",
        "headers": [(KIND_HEADER, b"good"), (p.DESTINATION, topics.dest.encode()), (p.AT, b"0")],
    }
    with Supervisor(workers):
        ingest_pid = workers[0].proc.pid if workers[0].proc else None
        send(stack.bootstrap, topics.retry, records)
        send(stack.bootstrap, topics.retry, [good])
        done = wait_done(database_url, len(records) + 1, timeout_s)
        same_process = (
            workers[0].starts == 1
            and workers[0].alive
            and workers[0].proc is not None
            and workers[0].proc.pid == ingest_pid
        )
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT status::text, dead_reason, reason, last_error, headers FROM retry_jobs_all"
        ).fetchall()
    by_kind: dict[str, dict[str, Any]] = {}
    for row in rows:
        kinds = [v for k, v in decode_headers(row["headers"]) if k == KIND_HEADER]
        if kinds and kinds[0] is not None:
            by_kind[kinds[0].decode()] = row
    seen = read_topics(stack.bootstrap, [topics.dest, topics.dlq])
    dest, dlq = seen[topics.dest], seen[topics.dlq]
    outcomes = [_bad_input_outcome(bad, by_kind, dest, dlq) for bad in corpus]
    good_after = any(s.header(KIND_HEADER) == "good" for s in dest)
    if not done:
        log.warning("bad input: not every record was accounted for within %.0f s", timeout_s)
    return BadInputResult(
        kinds=len(corpus),
        lost=sum(not o["ok"] for o in outcomes),
        same_ingest_process=same_process,
        good_record_after=good_after,
        seconds=round(time.monotonic() - began, 2),
        outcomes=outcomes,
    )
