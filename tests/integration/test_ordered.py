"""Per-key ordering (the consumer helper's ordered mode), on the real broker and PostgreSQL.

The scheduler's part: records parked behind a retry (``retry.hold``) wait until that retry's release
record (``retry.release``), or its death, then go out one at a time in their original order. The whole:
a real consumer in ordered mode, keys interleaved, some of their records failing (one for good), the
consumer restarted mid-way; each key's records are handled in their original order, none lost.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Message
from confluent_kafka.admin import AdminClient, NewTopic

from bench.loop_threads import LoopThreads
from retry_scheduler.cli.main import main as cli_main
from retry_scheduler.cli.service import status_report
from retry_scheduler.consumer import RetryingConsumer
from retry_scheduler.core import protocol as p
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.jobs import CopyRow
from retry_scheduler.core.records import RowBuilder
from retry_scheduler.db.chains import waiting_chains
from retry_scheduler.db.store import Store
from retry_scheduler.dev.procs import free_port
from retry_scheduler.holds import Hold, HoldStore, HoldsUnavailable
from retry_scheduler.holds import create_topics as create_holds_topics
from retry_scheduler.loops.publish import Publisher
from retry_scheduler.ops.monitor import Reading, evaluate
from retry_scheduler.ops.thresholds import Thresholds
from tests.integration.test_loop import Loop, hdr, new_loop
from tests.kafkautil import QUICK_JOIN, consume, create_topics, produce

pytestmark = pytest.mark.integration


@pytest.fixture
def loop(database_url: str, bootstrap_servers: str, topic_prefix: str) -> Iterator[Loop]:
    yield new_loop(
        database_url,
        bootstrap_servers,
        topic_prefix,
        destination_allowlist=rf"^{topic_prefix}-orders$",  # its redelivery topics come with it
    )


def parked(loop: Loop, offset: int, blocker: str, key: bytes = b"k") -> dict:
    """A record of ``key`` parked behind ``blocker``, as the consumer helper sends it."""
    return {
        "key": key,
        "value": f"v{offset}".encode(),
        "headers": hdr(original_topic=loop.dest, original_partition="0", original_offset=str(offset),
                       id=f"id-{offset}", group="billing", hold=blocker),
    }  # fmt: skip


def failed(loop: Loop, offset: int, retry_id: str, key: bytes = b"k", **more: str) -> dict:
    return {
        "key": key,
        "value": f"v{offset}".encode(),
        "headers": hdr(original_topic=loop.dest, original_partition="0", original_offset=str(offset),
                       id=retry_id, group="billing", **{"at": str(int(time.time() * 1000)), **more}),
    }  # fmt: skip


def release(loop: Loop, blocker: str, key: bytes = b"k") -> dict:
    return {
        "key": key,
        "value": None,
        "headers": hdr(original_topic=loop.dest, group="billing", release=blocker),
    }


def head(loop: Loop, offset: int, retry_id: str, chain: str, key: bytes = b"k", **more: str) -> dict:
    """The retry of a failed record heading ``chain``, as the consumer helper sends it."""
    record = failed(loop, offset, retry_id, key, **more)
    record["headers"] += hdr(blocks=chain)
    return record


def chain_rows(loop: Loop, chain: str) -> list[tuple[int, str, bool]]:
    """(original offset, status, due) of the chain's jobs, in original order."""
    rows = loop.rows(f"held_by = '{chain}'")
    return sorted((r["original_offset"], r["status"], r["due_at"].year < 9999) for r in rows)


def test_held_records_go_out_after_the_release_one_at_a_time_in_original_order(loop: Loop) -> None:
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic])
    # The head (offset 1) of chain C, then its key's later records parked in C, not in their order here
    loop.send([head(loop, 1, "r1", "C"), parked(loop, 4, "C"), parked(loop, 2, "C"), parked(loop, 3, "C")])
    assert loop.ingest(4).stored == 4
    assert loop.publish(3).published == 1
    [first] = consume(loop.bootstrap, [loop.dest], expected=1)
    # the head comes back with its chain, so that the helper knows it
    assert (first.value, first.header(p.HOLD), first.header(p.BLOCKS), first.header(p.ATTEMPT)) == (
        b"v1",
        None,
        "C",
        "1",
    )
    held = loop.rows("held_by IS NOT NULL")
    assert [(r["status"], r["due_at"].year, r["attempt"]) for r in held] == [("pending", 9999, 0)] * 3
    report = status_report(loop.settings, None, 300)
    assert (report["pending"], report["waiting"], report["waiting_chains"], report["published"]) == (
        3,
        3,
        1,
        1,
    )
    assert 0 <= report["oldest_waiting_s"] < 60
    assert report["held"] == report["waiting"]  # 0.4's name, deprecated for one release

    loop.send([release(loop, "C")])
    counts = loop.ingest(1)
    assert (counts.consumed, counts.stored, counts.duplicates) == (1, 0, 0)  # a release is no job
    assert loop.publish(4).published == 3
    seen = consume(loop.bootstrap, [loop.dest], expected=4)
    assert [
        (s.value, s.header(p.HOLD), s.header(p.CHAIN_STATE), s.header(p.ATTEMPT), s.header(p.ID))
        for s in seen[1:]
    ] == [
        (b"v2", "C", "released", "0", "id-2"),  # the attempt stays: a held record did not fail
        (b"v3", "C", "released", "0", "id-3"),
        (b"v4", "C", "released", "0", "id-4"),
    ]
    # one at a time: each published only after the one before it was acknowledged
    done = sorted(loop.rows("held_by IS NOT NULL"), key=lambda r: r["published_at"])
    assert [r["original_offset"] for r in done] == [2, 3, 4]
    assert all(a["published_at"] <= b["due_at"] for a, b in itertools.pairwise(done))

    # a record parked while its chain flows says so, and goes in its turn
    flowing = parked(loop, 5, "C")
    flowing["headers"] += hdr(chain_state="released")
    loop.send([flowing])
    loop.ingest(1)
    assert loop.publish(3).published == 1
    assert consume(loop.bootstrap, [loop.dest], expected=5)[-1].value == b"v5"


def test_a_chain_waits_for_a_new_head_and_its_records_stay_behind_it(loop: Loop) -> None:
    """Found 1 (issue 29): a parked record that fails when it comes back heads the chain; storing its
    retry withdraws the chain's release, so no later record of the key is published until it was
    handled, whatever was released before (0.4.0 let a later record out ahead of the older ones)."""
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic])
    loop.send([head(loop, 1, "r1", "C")] + [parked(loop, n, "C") for n in (2, 3, 4)] + [release(loop, "C")])
    loop.ingest(5)
    assert publish_round(loop) == 2  # the head, and #2 (its turn: C released); #3 falls due
    assert chain_rows(loop, "C") == [(2, "published", True), (3, "pending", True), (4, "pending", False)]
    # #2 fails at the helper: its retry heads C, due in a second; #3 was let out already
    loop.send([head(loop, 2, "id-2", "C", at=str(int(time.time() * 1000) + 1000))])
    loop.ingest(1)
    with Store(loop.settings.database_url) as store:
        assert store.conn.execute(  # C waits for #2's retry (its head): no longer released
            "SELECT why, head FROM retry_released_holds WHERE blocker = 'C'"
        ).fetchall() == [("blocked", "id-2")]
    time.sleep(1.1)
    published = loop.publish(2)  # #3 (let out before), #2's retry; #4 stays held: the chain waits
    assert published.published == 2
    assert chain_rows(loop, "C") == [(2, "published", True), (3, "published", True), (4, "pending", False)]
    # the helper passes #3 back (its turn has not come), then handles #2's retry and releases C
    loop.send([parked(loop, 3, "C"), release(loop, "C")])
    loop.ingest(2)
    assert loop.publish(3).published == 2
    seen = [
        (m.value, m.header(p.HOLD), m.header(p.BLOCKS))
        for m in consume(loop.bootstrap, [loop.dest], expected=6)
    ]
    assert seen[:2] == [(b"v1", None, "C"), (b"v2", "C", None)]
    # #3 and #2's retry fell due together: the task's two publishers (publish_workers) may claim one
    # each and either may be acknowledged first. Either order is safe: #3 says it waits in C, which
    # #2's retry blocks, so the helper passes it back (test_ordered_model checks what it handles).
    assert sorted(seen[2:4]) == [(b"v2", None, "C"), (b"v3", "C", None)]
    assert seen[4:] == [(b"v3", "C", None), (b"v4", "C", None)]  # after the new head: #3, then #4


def test_a_release_with_nothing_held_keeps_no_state_and_a_dead_head_keeps_its_mark(loop: Loop) -> None:
    """The helper releases every head it handled (a copy parked by a member that died may wait), so a
    release of a chain nothing waits in must cost nothing: no row. A head that died keeps its chain's
    row, nothing held or not: the helper may still park records behind it, not knowing."""
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic, f"{loop.dest}.billing.redelivery"])

    def states() -> list[tuple[str, str, str | None]]:
        with Store(loop.settings.database_url) as store:
            return store.conn.execute(
                "SELECT blocker, why, head FROM retry_released_holds ORDER BY blocker"
            ).fetchall()

    loop.send([release(loop, "E")])
    loop.ingest(1)
    assert states() == []
    loop.send([head(loop, 1, "r9", "F", attempt="2", reason="payment service down")])  # its last attempt
    assert dict(loop.ingest(1).dead) == {"exhausted": 1}
    assert states() == [("F", "dead", "r9")]
    loop.send([parked(loop, 2, "F")])  # parked after, by a helper that does not know yet
    loop.ingest(1)
    loop.publish(3)
    [seen] = [m for m in consume(loop.bootstrap, [loop.dest], expected=1) if m.header(p.HOLD) == "F"]
    assert (seen.value, seen.header(p.CHAIN_STATE)) == (b"v2", "dead:r9")
    loop.send([release(loop, "F")])  # the dead head replayed and handled: the chain is done
    loop.ingest(1)
    assert states() == []


def test_a_stuck_chain_is_seen_alerted_and_released_by_an_operator(
    loop: Loop, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29, item 4: a chain whose head's retry went out and was never released by its consumer
    waits for ever, silently, in 0.4.0. Now `status`, `chains list`, the metrics' reading and
    retry_monitor show it as stuck, and `chains release` lets it go as if its head had died; a chain
    whose head is still pending here gives that head up (dead, on the DLQ) so it cannot come back."""
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic, f"{loop.dest}.billing.redelivery"])
    future = str(int(time.time() * 1000) + 3_600_000)
    loop.send([head(loop, 1, "r1", "C"), parked(loop, 2, "C"), parked(loop, 3, "C")])
    loop.send([head(loop, 11, "r2", "D", key=b"j", at=future), parked(loop, 12, "D", key=b"j")])
    loop.ingest(5)
    assert publish_round(loop) == 1  # C's head goes out; its consumer never releases C
    with Store(loop.settings.database_url) as store:
        chains = {c.chain: c for c in waiting_chains(store.conn)}
        assert store.readings.chains_waiting().stuck == 1
        raw = store.readings.monitor_reading(300)
    assert (chains["C"].state, chains["C"].head, chains["C"].head_pending, chains["C"].stuck) == (
        "blocked", "r1", False, True
    )  # fmt: skip
    assert (chains["C"].waiting, chains["C"].key, chains["C"].destination) == (2, b"k", loop.dest)
    assert (chains["D"].head_pending, chains["D"].stuck) == (True, False)  # waits for r2, due in an hour
    report = status_report(loop.settings, None, 300)
    assert (report["waiting"], report["waiting_chains"], report["stuck_chains"]) == (3, 2, 1)
    reading = Reading.from_store(raw, 300)
    assert (reading.stuck_chains, reading.stuck_chain_ids) == (1, ("C",))
    [alert] = [o for o in evaluate(reading, Thresholds(stuck_chain_s=0), {}) if o.check == "stuck_chains"]
    assert alert.transition == "new" and alert.alert is not None and "C" in alert.alert.text

    url = loop.settings.database_url
    assert cli_main(["--database-url", url, "chains", "list", "--stuck", "--json"]) == 0
    assert [c["chain"] for c in json.loads(capsys.readouterr().out)] == ["C"]
    assert cli_main(["--database-url", url, "chains", "release", "C", "D", "gone"]) == 2  # not confirmed
    assert cli_main(["--database-url", url, "chains", "release", "C", "D", "gone", "--yes", "--json",
                     "--why", "INC-42"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out == {"released": ["C", "D"], "heads_dead": ["r2"], "not_waiting": ["gone"]}
    # a chain going out already is left as it is
    assert cli_main(["--database-url", url, "chains", "release", "C", "--yes", "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == {"released": [], "heads_dead": [], "not_waiting": ["C"]}
    [r2] = loop.rows("retry_id = 'r2'")
    assert (r2["status"], r2["dead_reason"]) == ("dead", "requested")
    assert r2["reason"].startswith("its chain was released by an operator (INC-42)")
    published = loop.publish(3)
    assert published.published == 3 and published.dead_published == 1  # C #2, #3, D #12; r2 to the DLQ
    seen = consume(loop.bootstrap, [loop.dest], expected=4)
    assert [(m.value, m.header(p.CHAIN_STATE)) for m in seen if m.key == b"k"] == [
        (b"v1", None), (b"v2", "dead:r1"), (b"v3", "dead:r1")
    ]  # fmt: skip
    assert [(m.value, m.header(p.CHAIN_STATE)) for m in seen if m.key == b"j"] == [(b"v12", "dead:r2")]
    with Store(url) as store:
        assert waiting_chains(store.conn) == [] and store.readings.chains_waiting().stuck == 0
        audit = store.conn.execute(
            "SELECT action, actor, matched, skipped FROM retry_dlq_audit ORDER BY id"
        ).fetchall()
    assert [(a, m, s) for a, _, m, s in audit] == [
        ("release_chains", 2, {"not_waiting": 1}), ("release_chains", 0, {"not_waiting": 1})
    ]  # fmt: skip
    assert audit[0][1].startswith("cli:")


def test_held_records_past_their_policys_max_age_release_their_chain(loop: Loop, tmp_path: Path) -> None:
    """The policy's max_age applies to held records: a chain whose oldest held record was first seen
    longer ago than it allows is released, by the publish loop, as if its head had expired."""
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic, f"{loop.dest}.billing.redelivery"])
    future = str(int(time.time() * 1000) + 3_600_000)
    old = parked(loop, 2, "E")
    old["headers"] = [(k, v) for k, v in old["headers"] if k != p.ORIGINAL_TIMESTAMP]
    old["headers"] += hdr(original_timestamp=str(int(time.time() * 1000) - 7_200_000))  # two hours ago
    loop.send([head(loop, 1, "r5", "E", at=future), old, head(loop, 21, "r6", "F", key=b"j", at=future),
               parked(loop, 22, "F", key=b"j")])  # fmt: skip
    loop.ingest(4)
    policies = tmp_path / "retry_policies.py"
    policies.write_text(
        "from retry_scheduler.core.policy import Policy\n"
        'POLICIES = [Policy("default", delays=["1s"], max_attempts=2, max_age="1h")]\n'
    )
    published = loop.publish(3, policies_path=str(policies))
    assert (published.published, published.dead_published) == (1, 1)  # E's #2; its head r5, expired
    [r5] = loop.rows("retry_id = 'r5'")
    assert (r5["status"], r5["dead_reason"]) == ("dead", "expired")
    [seen] = [m for m in consume(loop.bootstrap, [loop.dest], expected=1)]
    assert (seen.value, seen.header(p.CHAIN_STATE)) == (b"v2", "dead:r5")
    with Store(loop.settings.database_url) as store:
        assert [c.chain for c in waiting_chains(store.conn)] == ["F"]  # one hour old at most: it waits


def test_a_replayed_dead_head_goes_back_as_a_new_record_of_its_key(
    loop: Loop, capsys: pytest.CaptureFixture[str]
) -> None:
    """A head that died let its chain go on; replayed from the DLQ it must not come back as that
    chain's head (the helper would skip it as a copy of a head already handled): it goes back without
    its retry.blocks, and the helper handles it as a new record of its key."""
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic, f"{loop.dest}.billing.redelivery"])
    loop.send([head(loop, 1, "r7", "G", attempt="2", reason="payment service down")])  # its last attempt
    assert dict(loop.ingest(1).dead) == {"exhausted": 1}
    assert loop.publish(2).dead_published == 1
    [dead] = loop.rows("retry_id = 'r7'")
    url = loop.settings.database_url
    assert cli_main(["--database-url", url, "dlq", "replay", "--ids", str(dead["id"]), "--yes"]) == 0
    capsys.readouterr()
    assert loop.publish(2).published == 1
    [seen] = consume(loop.bootstrap, [loop.dest], expected=1)
    assert (seen.value, seen.header(p.ID), seen.header(p.BLOCKS)) == (b"v1", "r7", None)


def test_chains_are_forgotten_a_week_after_nothing_waits_in_them(loop: Loop) -> None:
    """retry_released_holds does not grow for ever: a chain's row goes a week after nothing is held in
    it, unless it still waits for a pending head (a long backoff)."""
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic])
    future = str(int(time.time() * 1000) + 3_600_000)
    loop.send([head(loop, 1, "r8", "P", at=future), parked(loop, 5, "Q", key=b"q")])  # P waits for r8
    loop.ingest(2)
    with Store(loop.settings.database_url) as store:
        store.conn.execute(
            "INSERT INTO retry_released_holds (blocker, why, head) VALUES ('old', 'released', NULL), "
            "('gone', 'blocked', 'nobody'), ('Q', 'released', NULL), ('new', 'dead', 'x')"
        )
        store.conn.execute(
            "UPDATE retry_released_holds SET released_at = now() - interval '8 days' WHERE blocker <> 'new'"
        )
        store.conn.commit()
        assert store.queue.forget_released_holds(7 * 86400) == 2
        left = sorted(row[0] for row in store.conn.execute("SELECT blocker FROM retry_released_holds"))
    assert left == ["P", "Q", "new"]  # P: its head pending; Q: a record held in it; new: a day old


def test_one_due_job_per_chain_is_a_rule_the_database_enforces(loop: Loop) -> None:
    """Found 2 (issue 29): two transactions advancing one chain at once (a publisher marking one of
    its jobs, the ingest storing a record parked in it) each made a different job due, the later offset
    first. Now the second waits for the first's lock and finds one due; a second due job is an error."""
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic])
    loop.send([parked(loop, n, "C") for n in (3, 4)] + [release(loop, "C")])
    loop.ingest(3)
    assert chain_rows(loop, "C") == [(3, "pending", True), (4, "pending", False)]
    with Store(loop.settings.database_url) as publisher, Store(loop.settings.database_url) as ingest:
        with publisher.conn.transaction():
            # the publisher: #3 published, the next of C falls due, not committed yet
            publisher.conn.execute(
                "UPDATE retry_jobs SET due_at = '9999-12-31 00:00:00+00' WHERE held_by = 'C'"
            )
            publisher.conn.execute("DELETE FROM retry_jobs WHERE held_by = 'C' AND original_offset = 3")
            assert publisher.queue.advance_holds(["C"]) == 1  # #4
            done = threading.Event()
            stored: list[object] = []

            def store_parked() -> None:  # the ingest: #2, parked again (a lower offset), meanwhile
                row = parked_row(loop, 2, "C")
                stored.append(ingest.queue.insert_rows([row]))
                done.set()

            thread = threading.Thread(target=store_parked)
            thread.start()
            assert not done.wait(1.0), "the ingest's advance of C did not wait for the publisher's"
        thread.join(30)
    assert stored == [[None]]
    # one due: #4 (the publisher's, first); #2 waits until #4 is published, then goes
    assert chain_rows(loop, "C") == [(2, "pending", False), (4, "pending", True)]
    with psycopg.connect(loop.settings.database_url) as conn, pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("UPDATE retry_jobs SET due_at = now() WHERE held_by = 'C' AND original_offset = 2")


def publish_round(loop: Loop) -> int:
    """One round of the publish loop; how many jobs it published."""
    with Store(loop.settings.database_url) as store:
        publisher = Publisher(Deployment.load(loop.settings), store)
        try:
            return publisher.publish_once().published
        finally:
            publisher.close()


def parked_row(loop: Loop, offset: int, chain: str) -> CopyRow:
    """The row the ingest stores for a record parked in ``chain`` (read from a real record's headers)."""
    builder = RowBuilder(Deployment(loop.settings, loop.registry))
    record = parked(loop, offset, chain)
    row = builder.row(loop.settings.retry_topic, 0, 10_000 + offset, None, record["key"], record["value"],
                      record["headers"], int(time.time() * 1000))  # fmt: skip
    assert row is not None and row.held_by == chain
    return row


def test_a_dead_blocker_releases_its_chain(loop: Loop) -> None:
    """0.4.0's chains, named by their blocker's retry.id (no retry.blocks): still released when it dies."""
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic, f"{loop.dest}.billing.redelivery"])
    # parked first, while the blocker is still being retried; then its last attempt fails (2 allowed)
    loop.send([parked(loop, 3, "D"), parked(loop, 2, "D")])
    loop.ingest(2)
    assert loop.publish(2).published == 0
    loop.send([failed(loop, 1, "D", attempt="2", reason="payment service down")])
    counts = loop.ingest(1)
    assert dict(counts.dead) == {"exhausted": 1}
    published = loop.publish(4)
    assert (published.published, published.dead_published) == (2, 1)
    assert [s.value for s in consume(loop.bootstrap, [loop.dest], expected=2)] == [b"v2", b"v3"]
    with Store(loop.settings.database_url) as store:
        why = store.conn.execute("SELECT why FROM retry_released_holds WHERE blocker = 'D'").fetchone()
    assert why == ("dead",)

    # one parked after its blocker died goes at once too
    loop.send([parked(loop, 4, "D")])
    loop.ingest(1)
    assert loop.publish(3).published == 1


def test_a_record_carries_at_most_one_chain_header(loop: Loop) -> None:
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic])
    bad = release(loop, "B")
    bad["headers"] += hdr(hold="C")
    heads_and_parked = failed(loop, 2, "r2", blocks="C")
    heads_and_parked["headers"] += hdr(hold="C")
    empty = parked(loop, 1, " ")
    state_alone = failed(loop, 3, "r3", chain_state="released")
    dead_state = parked(loop, 4, "C")
    dead_state["headers"] += hdr(chain_state="dead:x")
    loop.send([bad, heads_and_parked, empty, state_alone, dead_state])
    counts = loop.ingest(5)
    assert dict(counts.dead) == {"invalid": 5}
    reasons = [r["reason"] for r in loop.rows()]
    assert "carries at most one of retry.hold, retry.release and retry.blocks" in reasons[0]
    assert "carries at most one of retry.hold, retry.release and retry.blocks" in reasons[1]
    assert "retry.hold must name the key's chain (1 to 200 characters)" in reasons[2]
    assert "retry.chain-state is sent only as 'released', with retry.hold" in reasons[3]
    assert "retry.chain-state is sent only as 'released', with retry.hold" in reasons[4]


def test_topics_are_created_once_and_one_not_created_is_named(
    bootstrap_servers: str, topic_prefix: str
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    there, new = f"{topic_prefix}-there", f"{topic_prefix}-new"
    create_topics(bootstrap_servers, [there])

    assert create_holds_topics(admin, [NewTopic(there, 1, -1), NewTopic(new, 2, -1)]) == {}
    # Created means the controller committed it; the broker's metadata follows (a CI run under load
    # once listed the topics before the new one was there).
    deadline = time.monotonic() + 30
    while not {there, new} <= set(listed := admin.list_topics(timeout=10).topics):
        assert time.monotonic() < deadline, sorted(listed)
        time.sleep(0.2)
    assert len(listed[new].partitions) == 2
    assert create_holds_topics(admin, []) == {}
    # A broker that does not answer: each topic is named with the reason, nothing is raised.
    gone = AdminClient({"bootstrap.servers": f"127.0.0.1:{free_port()}"})
    failed = create_holds_topics(gone, [NewTopic(new, 1, -1)], timeout_s=2)
    assert list(failed) == [new] and failed[new], failed


def test_the_hold_store_reads_back_its_groups_holds_and_skips_what_is_not_one(
    bootstrap_servers: str, topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic, config = f"{topic_prefix}-holds", {"bootstrap.servers": bootstrap_servers, "group.id": "a"}
    billing, shipping = HoldStore(config, "billing", topic), HoldStore(config, "shipping", topic)
    billing.ensure_topic()
    billing.ensure_topic()  # there already: nothing to do
    flowing = Hold("C1", None, None, [(0, 12), (0, 15), (2, 3)], partition=0)
    waiting = Hold("C2", "r9", 3, [(1, 2**40)], dead="r7", partition=1)
    billing.put("orders", b"k1", flowing)
    billing.put("orders", b"\x00\xffk", waiting)  # any key bytes
    billing.put("orders", b"k2", Hold("D", "r1", 1))
    billing.put("orders", b"k2", None)  # free again
    shipping.put("orders", b"k1", Hold("X", "rx", 1))
    produce(bootstrap_servers, topic, [
        {"key": b"billing\0orders\0k3", "value": b"not json"},
        {"key": b"billing\0orders\0k4", "value": b'{"blocker": 5}'},
        {"key": b"billing\0\xff\0k5", "value": b'{"blocker": "E"}'},
        {"key": b"billing\0orders\0k6", "value": b'{"v": 2, "chain": "F", "parked": {"0": ["x"]}}'},
        {"key": b"billing\0orders\0k7", "value": b"[" * 100_000},
        # written by 0.4.0's helper: read as a chain named by its blocker, its parked records counted
        {
            "key": b"billing\0orders\0k8",
            "value": b'{"blocker": "B", "released": true, "parked": 2, "dead": false}',
        },
        {"key": b"billing\0orders\0k9", "value": b'{"blocker": "G", "released": false, "parked": 1}'},
        {"key": b"unrelated", "value": b"{}"},
    ])  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="retry_scheduler.holds"):
        assert billing.load() == {
            ("orders", b"k1"): flowing,
            ("orders", b"\x00\xffk"): waiting,
            ("orders", b"k8"): Hold("B", None, None, [], None, legacy=2),
            ("orders", b"k9"): Hold("G", "G", None, [], None, legacy=1),
        }
    assert shipping.load() == {("orders", b"k1"): Hold("X", "rx", 1)}
    assert caplog.text.count("is not a hold, left out") == 5
    billing.close()
    shipping.close()


def test_the_hold_store_says_when_the_holds_cannot_be_read_and_never_raises_otherwise(
    bootstrap_servers: str, topic_prefix: str
) -> None:
    config = {"bootstrap.servers": bootstrap_servers, "group.id": "a"}
    with pytest.raises(HoldsUnavailable, match=f"the holds topic {topic_prefix}-gone is not there"):
        HoldStore(config, "billing", f"{topic_prefix}-gone").load(timeout_s=5)
    down = {"bootstrap.servers": f"127.0.0.1:{free_port()}", "group.id": "a"}
    began = time.monotonic()
    with pytest.raises(HoldsUnavailable, match="cannot be read"):
        HoldStore(down, "billing", f"{topic_prefix}-holds").load(timeout_s=3)
    assert time.monotonic() - began < 15  # bounded


# -- end to end: a real consumer in ordered mode ---------------------------------------------------------

KEYS = 6
PER_KEY = 8


class Service(LoopThreads):
    """The scheduler's ingest and publish loops, running in threads as the Airflow DAG runs them."""

    def __init__(self, loop: Loop) -> None:
        super().__init__(
            loop.settings,
            loop.registry,
            300,
            publish_settings=loop.settings.with_overrides(poll_interval_ms=100),
        )


class App:
    """The application: handles ``k{n}`` records whose value is their place in the key's order.

    ``failures[(key, n)]`` is how many times that record fails before it succeeds (-1: always); then
    a record in ``fatal`` fails with an error the helper's client dead-letters at once."""

    def __init__(
        self, failures: dict[tuple[bytes, int], int], fatal: frozenset[tuple[bytes, int]] = frozenset()
    ) -> None:
        self.failures = dict(failures)
        self.fatal = fatal
        self.handled: dict[bytes, list[int]] = defaultdict(list)
        self.calls = 0
        #: The threads that handled records (one per consumer group member).
        self.members: set[str] = set()

    def handle(self, msg: Message) -> None:
        key, value = msg.key(), msg.value()
        assert isinstance(key, bytes) and isinstance(value, bytes)
        n = int(value)
        self.calls += 1
        left = self.failures.get((key, n), 0)
        if left:
            self.failures[(key, n)] = left - 1
            raise TimeoutError(f"{key!r} #{n}: the ledger is not there yet")
        if (key, n) in self.fatal:
            raise ValueError(f"{key!r} #{n}: not a ledger entry")
        self.handled[key].append(n)
        self.members.add(threading.current_thread().name)


def records() -> list[dict]:
    """``PER_KEY`` records of each of ``KEYS`` keys, interleaved: k0 #0, k1 #0, ... k0 #1, ..."""
    return [{"key": f"k{k}".encode(), "value": str(n).encode()} for n in range(PER_KEY) for k in range(KEYS)]


def assert_in_order(app: App, dead: set[tuple[bytes, int]]) -> None:
    """Every key's records were handled in their original order, all but ``dead``; a record handled
    twice in a row (at-least-once) is allowed, one handled again later is not."""
    for k in range(KEYS):
        key = f"k{k}".encode()
        want = [n for n in range(PER_KEY) if (key, n) not in dead]
        got = app.handled[key]
        assert [n for i, n in enumerate(got) if i == 0 or got[i - 1] != n] == want, (key, got)


def test_every_keys_records_are_handled_in_order_across_failures_and_a_restart(
    loop: Loop, topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    group = f"{topic_prefix}-billing"
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic, f"{topic_prefix}-dlq"], partitions=2)
    create_topics(loop.bootstrap, [f"{loop.dest}.{group}.redelivery"], partitions=2)
    failures = {
        (b"k0", 0): 1,  # the first record of a key, once: everything after it waits
        (b"k1", 3): 1,  # one in the middle
        (b"k1", 5): 1,  # and a second chain on the same key
        (b"k2", 2): 1,  # a released record failing again while its chain comes back ...
        (b"k2", 4): 1,  # ... and one behind it
        (b"k3", 1): -1,  # never succeeds: dead after the policy's 2 attempts, the rest go on in order
        (b"k4", 1): 1,  # fails, then comes back and fails for good (fatal) with records behind it
    }
    dead = {(b"k3", 1), (b"k4", 1), (b"k5", 2)}
    app = App(failures, fatal=frozenset({(b"k4", 1), (b"k5", 2)}))  # k5 #2: dead at once, holds nothing
    config = {
        "bootstrap.servers": loop.bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "topic.metadata.refresh.interval.ms": 1000,
        **QUICK_JOIN,
    }

    def consumer() -> RetryingConsumer:
        c = RetryingConsumer(
            config, [loop.dest], app.handle, ordered=True, holds_topic=f"{topic_prefix}-holds"
        )
        c.retries.retry_topic = loop.settings.retry_topic
        c.retries.fatal_errors = (ValueError,)
        return c

    service = Service(loop)
    first = consumer()
    try:
        produce(loop.bootstrap, loop.dest, records())
        # the first instance runs until a key's chain is coming back, its retry handled and records
        # parked behind it still out
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(h.released and h.parked for h in first.holds.values()):
            first.poll(0.2)
        held_at_stop = dict(first.holds)
        first.close()
        assert any(h.released and h.parked for h in held_at_stop.values()), held_at_stop

        # a new instance (a restart, or the member the partitions moved to) knows the holds
        kept = HoldStore(config, group, f"{topic_prefix}-holds").load()  # what a restart reads
        assert {where: hold for where, hold in kept.items() if not hold.finished} == held_at_stop
        second = consumer()
        with caplog.at_level(logging.WARNING, logger="retry_scheduler.consumer"):
            deadline = time.monotonic() + 150
            expected = KEYS * PER_KEY - len(dead)
            while time.monotonic() < deadline and (
                sum(len(set(v)) for v in app.handled.values()) < expected or second.holds
            ):
                second.poll(0.2)
        second.close()
    finally:
        service.close()

    assert_in_order(app, dead)
    left = HoldStore(config, group, f"{topic_prefix}-holds").load()
    assert left and all(h.finished for h in left.values()), left  # every key free again (finished chains)
    assert sorted((r["msg_key"], r["msg_value"], r["dead_reason"]) for r in loop.rows("status = 'dead'")) == [
        (b"k3", b"1", "exhausted"),
        (b"k4", b"1", "requested"),  # the client's fatal_errors send it with retry.send-to=dlq
        (b"k5", b"2", "requested"),
    ]
    # k5 #2 held nothing back: none of k5's records was parked
    assert not loop.rows("msg_key = 'k5' AND held_by IS NOT NULL")
    assert "is dead: the records held behind it are handled in order" in caplog.text
    assert not loop.rows("status = 'pending'")  # nothing left behind


def test_the_records_held_behind_a_dead_retry_can_be_dead_lettered_instead(
    loop: Loop, topic_prefix: str
) -> None:
    group = f"{topic_prefix}-billing"
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic, f"{topic_prefix}-dlq"])
    create_topics(loop.bootstrap, [f"{loop.dest}.{group}.redelivery"])
    app = App({(b"k0", 0): -1})  # never succeeds: dead after the policy's 2 attempts
    config = {"bootstrap.servers": loop.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
              "topic.metadata.refresh.interval.ms": 1000, **QUICK_JOIN}  # fmt: skip
    consumer = RetryingConsumer(
        config,
        [loop.dest],
        app.handle,
        ordered=True,
        holds_topic=f"{topic_prefix}-holds",
        after_dead="dead-letter",
    )
    consumer.retries.retry_topic = loop.settings.retry_topic
    service = Service(loop)
    try:
        produce(loop.bootstrap, loop.dest, [{"key": b"k0", "value": str(n).encode()} for n in range(4)])
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(loop.rows("status = 'dead'")) < 4:
            consumer.poll(0.2)
        while time.monotonic() < deadline and consumer.holds:  # the last one dead-lettered frees the key
            consumer.poll(0.2)
        assert not consumer.holds
        produce(loop.bootstrap, loop.dest, [{"key": b"k0", "value": b"4"}])  # after the chain: handled
        while time.monotonic() < deadline and not app.handled[b"k0"]:
            consumer.poll(0.2)
    finally:
        consumer.close()
        service.close()

    assert app.handled[b"k0"] == [4]
    dead = loop.rows("status = 'dead'")
    assert [(r["msg_value"], r["dead_reason"]) for r in dead] == [
        (b"0", "exhausted"),
        (b"1", "requested"),
        (b"2", "requested"),
        (b"3", "requested"),
    ]
    blocker = dead[0]["retry_id"]
    assert {r["reason"] for r in dead[1:]} == {f"held behind retry {blocker}, which is dead"}
    with pytest.raises(ValueError, match="after_dead must be 'release' or 'dead-letter'"):
        RetryingConsumer(config, [loop.dest], app.handle, ordered=True, after_dead="drop")


def test_order_holds_when_a_second_member_joins_and_takes_partitions_over(
    loop: Loop, topic_prefix: str
) -> None:
    """Two members of the group: the second joins while keys of the first are held, and takes over
    half the partitions. With ``scope="topic"`` a retry comes back to its key's partition of the
    topic, so a key's records and its retries always reach the same member."""
    group = f"{topic_prefix}-billing"
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic, f"{topic_prefix}-dlq"], partitions=2)
    app = App({(b"k0", 0): 1, (b"k1", 2): 2, (b"k2", 1): 1, (b"k4", 3): 1, (b"k5", 0): 1, (b"k5", 4): 1})
    config = {
        "bootstrap.servers": loop.bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        **QUICK_JOIN,
    }
    holds_topic = f"{topic_prefix}-holds"

    def member(name: str) -> tuple[RetryingConsumer, threading.Thread]:
        c = RetryingConsumer(
            config, [loop.dest], app.handle, scope="topic", ordered=True, holds_topic=holds_topic
        )
        c.retries.retry_topic = loop.settings.retry_topic
        return c, threading.Thread(target=c.run, args=(0.2,), name=name, daemon=True)

    service: Service | None = None
    first, first_thread = member("first")
    second, second_thread = member("second")
    try:
        produce(loop.bootstrap, loop.dest, records())
        first_thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(h.parked for h in first.holds.values()):
            time.sleep(0.05)
        assert any(h.parked for h in first.holds.values()), first.holds
        second_thread.start()  # joins: the group rebalances while keys are held
        # The retries come back only once the second member owns a partition: started before, the
        # scheduler could bring every retry back to the first member before the rebalance ended
        # (a loaded machine), and the second would have nothing left to take over.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (first.revocations and second.assigned):
            time.sleep(0.1)
        assert first.revocations and second.assigned, "the second member got no partition"
        service = Service(loop)
        deadline = time.monotonic() + 150
        store = HoldStore(config, group, holds_topic)
        while time.monotonic() < deadline:
            if sum(len(set(v)) for v in app.handled.values()) == KEYS * PER_KEY and all(
                hold.finished for hold in store.load().values()
            ):
                break
            time.sleep(1)
    finally:
        first.stop()
        second.stop()
        first_thread.join(30)
        second_thread.join(30)
        if service is not None:
            service.close()

    assert first.revocations >= 1  # the first member gave a partition up
    assert app.members == {"first", "second"}  # both members handled records
    assert_in_order(app, dead=set())
    assert not loop.rows("status <> 'published'")


def test_two_groups_in_ordered_mode_on_one_topic_never_release_each_others_chains(
    loop: Loop, topic_prefix: str
) -> None:
    """Found 6 (issue 29): records that already carry a ``retry.id`` (republished by another service's
    retry, say) failing in two groups: 0.4.0 named both groups' chains by that id, so the first group to
    handle its retry released the other's chain while the other's retry was still pending, and its
    later records overtook it. Chains are the helper's own now."""
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic, f"{topic_prefix}-dlq"])
    # the first record of k0 fails once in billing, twice (its retries a second apart) in shipping
    billing_app, shipping_app = App({(b"k0", 0): 1}), App({(b"k0", 0): 2})
    members: list[tuple[App, RetryingConsumer]] = []
    for name, app in (("billing", billing_app), ("shipping", shipping_app)):
        group = f"{topic_prefix}-{name}"
        create_topics(loop.bootstrap, [f"{loop.dest}.{group}.redelivery"])
        config = {"bootstrap.servers": loop.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "topic.metadata.refresh.interval.ms": 1000, **QUICK_JOIN}  # fmt: skip
        consumer = RetryingConsumer(
            config, [loop.dest], app.handle, ordered=True, holds_topic=f"{topic_prefix}-holds"
        )
        consumer.retries.retry_topic = loop.settings.retry_topic
        members.append((app, consumer))
    service = Service(loop)
    try:
        produce(
            loop.bootstrap,
            loop.dest,
            [
                {"key": b"k0", "value": str(n).encode(), "headers": [(p.ID, b"shared-id")]}
                for n in range(PER_KEY)
            ],
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
            len(set(app.handled[b"k0"])) == PER_KEY and not consumer.holds for app, consumer in members
        ):
            for _, consumer in members:
                consumer.poll(0.1)
    finally:
        for _, consumer in members:
            consumer.close()
        service.close()
    for app in (billing_app, shipping_app):
        got = app.handled[b"k0"]
        assert [n for i, n in enumerate(got) if i == 0 or got[i - 1] != n] == list(range(PER_KEY)), got
    assert shipping_app.calls == billing_app.calls + 1  # its first record failed once more


def test_a_chain_of_1200_records_behind_one_head_comes_back_whole_and_in_order(
    loop: Loop, topic_prefix: str, record_property: Callable[[str, object], None]
) -> None:
    """Issue 29: chains of 1 000+ records. One key's first record fails once; the 1 199 after it are
    parked behind it, then handled in their order once its retry succeeds, each once; a second failure
    in the middle (#600) makes the rest wait for it again. The time the chain took is recorded."""
    group = f"{topic_prefix}-billing"
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic, f"{topic_prefix}-dlq"])
    create_topics(loop.bootstrap, [f"{loop.dest}.{group}.redelivery"])
    count = 1200
    app = App({(b"k0", 0): 1, (b"k0", 600): 1})
    config = {"bootstrap.servers": loop.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
              "topic.metadata.refresh.interval.ms": 1000, **QUICK_JOIN}  # fmt: skip
    consumer = RetryingConsumer(
        config, [loop.dest], app.handle, ordered=True, holds_topic=f"{topic_prefix}-holds"
    )
    consumer.retries.retry_topic = loop.settings.retry_topic
    service = Service(loop)
    began = time.monotonic()
    try:
        produce(loop.bootstrap, loop.dest, [{"key": b"k0", "value": str(n).encode()} for n in range(count)])
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and (len(app.handled[b"k0"]) < count or consumer.holds):
            consumer.poll(0.05)
    finally:
        consumer.close()
        service.close()
    took = time.monotonic() - began
    record_property("chain_1200_s", round(took, 1))
    logging.getLogger(__name__).warning("a chain of %s records behind one head: %.1f s", count, took)
    assert app.handled[b"k0"] == list(range(count))
    assert app.calls == count + 2  # each once, the two failures twice
    assert not loop.rows("status = 'pending'")
    parked = loop.rows("held_by IS NOT NULL")
    assert len(parked) >= count - 1 and {r["status"] for r in parked} == {"published"}
