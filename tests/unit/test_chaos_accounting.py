"""The bulk chaos trials' count: what makes a record lost, a duplicate, or identified.

The trials themselves run in tests/integration/test_chaos.py; here the counting is fed known
outcomes, so a harness that could not see a loss would fail.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.chaos.bulk import account_archive, account_replayed
from bench.chaos.topics import Seen, Topics
from bench.chaos.trial import Expected
from retry_scheduler.core import protocol as p

TOPICS = Topics("c000")


def _expected(uid: str, outcome: str = p.DEAD_REQUESTED) -> Expected:
    return Expected(uid, outcome, 1, f"id-{uid}", None, None, None, b"t", uid.encode(), uid.encode() + b"|v")


def _seen(topic: str, exp: Expected, *, attempt: str, dead: bool, retry_id: str | None = None) -> Seen:
    headers: list[tuple[str, bytes | None]] = [
        ("trace", exp.trace),
        (p.ID, (retry_id or exp.retry_id or "").encode()),
        (p.ATTEMPT, attempt.encode()),
    ]
    if dead:
        headers.append((p.DEAD_REASON, exp.outcome.encode()))
    return Seen(topic, 0, 0, 1, exp.key, exp.value, headers)


def test_a_replayed_record_must_be_on_the_dlq_and_on_its_destination() -> None:
    a, b = _expected("r00000"), _expected("r00001")
    dlq = [_seen(TOPICS.dlq, e, attempt="1", dead=True) for e in (a, b)]
    dest = [_seen(TOPICS.dest, a, attempt="2", dead=False)]
    seen = {TOPICS.retry: [], TOPICS.dlq: dlq, TOPICS.dest: dest}

    tally = account_replayed([a, b], seen, TOPICS)

    assert (tally.records, tally.lost, tally.duplicates) == (2, 1, 0)
    assert tally.examples == ["r00001: expected published, found nowhere"]


def test_replayed_twice_is_a_duplicate_identified_only_when_id_and_attempt_agree() -> None:
    a = _expected("r00000")
    dlq = [_seen(TOPICS.dlq, a, attempt="1", dead=True)]
    twins = [_seen(TOPICS.dest, a, attempt="2", dead=False) for _ in range(2)]
    strangers = [
        _seen(TOPICS.dest, a, attempt="2", dead=False),
        _seen(TOPICS.dest, a, attempt="3", dead=False),
    ]

    identified = account_replayed([a], {TOPICS.retry: [], TOPICS.dlq: dlq, TOPICS.dest: twins}, TOPICS)
    unidentified = account_replayed([a], {TOPICS.retry: [], TOPICS.dlq: dlq, TOPICS.dest: strangers}, TOPICS)

    assert (identified.duplicates, identified.duplicates_unidentified, identified.ok) == (1, 0, True)
    assert (unidentified.duplicates, unidentified.duplicates_unidentified, unidentified.ok) == (1, 1, False)


def _archive(root: Path, rows: list[tuple[int, bytes, bytes]]) -> None:
    folder = root / "day=2026-11-25" / "destination=orders"
    folder.mkdir(parents=True)
    table = pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "msg_key": pa.array([r[1] for r in rows], pa.binary()),
            "msg_value": pa.array([r[2] for r in rows], pa.binary()),
        }
    )
    pq.write_table(table, folder / "part-00000.parquet")
    (root / "_temporary").mkdir()  # a killed write's leftovers are not the archive
    pq.write_table(table.slice(0, 1), root / "_temporary" / "part-00001.parquet")


def test_a_compacted_job_must_be_archived_with_its_payload_or_still_in_postgresql(tmp_path: Path) -> None:
    before = {1: (b"k1", b"v1"), 2: (b"k2", b"v2"), 3: (b"k3", b"v3"), 4: (b"k4", b"v4")}
    _archive(tmp_path, [(1, b"k1", b"v1"), (1, b"k1", b"v1"), (2, b"k2", b"changed")])

    tally = account_archive(before, left={3}, root=tmp_path)

    assert (tally.lost, tally.duplicates, tally.duplicates_unidentified, tally.wrong_headers) == (1, 1, 0, 1)
    assert sorted(tally.examples) == [
        "job 2: key or value changed in the archive",
        "job 4: neither in PostgreSQL nor in the archive",
    ]


def test_nothing_archived_and_nothing_left_is_everything_lost(tmp_path: Path) -> None:
    tally = account_archive({1: (None, b"v")}, left=set(), root=tmp_path / "missing")
    assert (tally.records, tally.lost, tally.ok) == (1, 1, False)
