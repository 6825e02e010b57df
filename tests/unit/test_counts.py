"""The loops' run counts add up field by field (the ingest's over batches and worker processes, the
publish loop's over rounds and helpers) and read back as their XCom."""

from __future__ import annotations

from collections import Counter
from dataclasses import fields

from retry_scheduler.loops.counts import IngestCounts, PublishCounts


def test_ingest_counts_add_every_field_and_keep_the_slowest_batch() -> None:
    total = IngestCounts(consumed=3, stored=2, dead=Counter(invalid=1), slowest_batch_s=0.5,
                         slowest_batch_records=10, adopted=Counter(spring=1))  # fmt: skip
    total.add(IngestCounts(consumed=4, stored=4, duplicates=1, pending=3, dead=Counter(invalid=2, fatal=1),
                           batches=2, untrusted_timestamps=1, slowest_batch_s=0.25, slowest_batch_records=99,
                           adopted=Counter(spring=2, connect=1), letters_unreadable=1))  # fmt: skip
    total.add(IngestCounts(slowest_batch_s=0.75, slowest_batch_records=7))
    assert total == IngestCounts(
        consumed=7, stored=6, duplicates=1, pending=3, dead=Counter(invalid=3, fatal=1), batches=2,
        untrusted_timestamps=1, slowest_batch_s=0.75, slowest_batch_records=7,
        adopted=Counter(spring=3, connect=1), letters_unreadable=1,
    )  # fmt: skip
    # What a worker process sends back as a dict is the same counts.
    assert IngestCounts.from_dict(total.as_dict()) == total
    assert set(total.as_dict()) == {f.name for f in fields(IngestCounts)}


def test_publish_counts_add_keep_the_largest_lateness_and_leave_out_an_empty_gated() -> None:
    total = PublishCounts(claimed=5, published=4, lateness_max_s=1.5, errors={"timeout": 1})
    total.keep("paused", 2)
    total.keep("deferred", 1)
    other = PublishCounts(claimed=2, failed=1, lateness_max_s=0.5, errors={"timeout": 2, "unknown": 1},
                          slowest_round_s=0.1234, slowest_round_jobs=2)  # fmt: skip
    other.keep("quota", 3)
    total.add(other)
    assert (total.claimed, total.published, total.failed, total.paused, total.deferred) == (7, 4, 1, 2, 1)
    assert (total.gated, total.errors, total.lateness_max_s) == (
        {"quota": 3},
        {"timeout": 3, "unknown": 1},
        1.5,
    )
    assert (total.kept_back, total.as_dict()["slowest_round_s"]) == (6, 0.123)
    assert "gated" not in PublishCounts(claimed=1).as_dict()
