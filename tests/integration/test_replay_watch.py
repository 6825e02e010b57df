"""A watched replay (issue 33): a canary first, the rest in waves, stopping by itself when the
records it sends come back.

Through the real loops (ingest and publish running in threads, as the ``retry_scheduler`` DAG runs
them), the broker and PostgreSQL, with an application that consumes the destination through the
SDK's ``RetryingConsumer`` and fails the records it is told to: its retries reach the retry topic and
are stored again, which is what the replay watches for.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest
from confluent_kafka import Message

from retry_scheduler.consumer import RetryingConsumer
from retry_scheduler.core import protocol
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.db.selection import Selection
from retry_scheduler.db.store import Store
from retry_scheduler.loops.ingest import Ingestor
from retry_scheduler.loops.publish import Publisher
from retry_scheduler.ops.dlq import Operation, Outcome, run_action
from retry_scheduler.ops.watch import Watch
from tests.integration.test_loop import Loop, hdr, new_loop
from tests.kafkautil import QUICK_JOIN, consume, create_topics, produce

pytestmark = pytest.mark.integration

#: The key of the record the application reads first, to show it has joined (never failed).
WARM_UP = b"warm-up"


@contextmanager
def running_loops(loop: Loop) -> Iterator[None]:
    """The ingest and publish loops, each in a thread of its own, until the block ends."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(make: Callable[[Store], Ingestor | Publisher]) -> None:
        try:
            with loop.store() as store:
                worker = make(store)
                try:
                    worker.run(600, should_stop=stop.is_set, grace_s=0)
                finally:
                    worker.close()
        except BaseException as exc:  # the test fails with it below
            errors.append(exc)

    deployment = Deployment(loop.settings, loop.registry)
    threads = [
        threading.Thread(target=run, args=(lambda s: Ingestor(deployment, s),), daemon=True),
        threading.Thread(target=run, args=(lambda s: Publisher(deployment, s),), daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        # Raised even when the block failed: a loop's error is what the block then waited for in vain.
        assert not errors, errors


class App:
    """The destination's application: fails every record whose key ``failing`` says, through the
    SDK's consumer helper (its retry goes to the retry topic with the record's ``retry.id``)."""

    def __init__(self, loop: Loop, group: str, failing: Callable[[bytes], bool]) -> None:
        self.handled: list[bytes] = []
        self.failing = failing
        config = {"bootstrap.servers": loop.bootstrap, "group.id": group, "auto.offset.reset": "earliest"}
        self.consumer = RetryingConsumer({**config, **QUICK_JOIN}, [loop.dest], self.handle, scope="topic")
        self.consumer.retries.retry_topic = loop.settings.retry_topic
        self.thread = threading.Thread(target=self.consumer.run, args=(0.2,), daemon=True)

    def handle(self, msg: Message) -> None:
        key = msg.key()
        assert isinstance(key, bytes)
        self.handled.append(key)
        if key != WARM_UP and self.failing(key):
            raise ConnectionError("the payments database is still down")

    @contextmanager
    def running(self, loop: Loop) -> Iterator[App]:
        """The application, once it has joined its group and handled a first record of its own."""
        self.thread.start()
        try:
            produce(loop.bootstrap, loop.dest, [{"key": WARM_UP, "value": b"{}"}])
            deadline = time.monotonic() + 90
            while WARM_UP not in self.handled:
                assert time.monotonic() < deadline, "the application never read the destination"
                time.sleep(0.2)
            yield self
        finally:
            self.consumer.stop()
            self.thread.join(30)


def dead_letters(loop: Loop, count: int) -> None:
    """``count`` dead jobs of the destination (exhausted at once: the policy allows 2 attempts)."""
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic])
    loop.send(
        [
            {"key": f"k{i:03d}".encode(), "value": b"v", "headers": hdr(destination=loop.dest, attempt="2")}
            for i in range(count)
        ]
    )
    assert loop.ingest(count).stored == count
    loop.publish(2)  # on the DLQ topic, as dead letters are before anyone replays them
    assert len(loop.rows("status = 'dead' AND dlq_published_at IS NOT NULL")) == count


def watched_replay(loop: Loop, watch: Watch, *, dry_run: bool = False) -> Outcome:
    operation = Operation(
        action="replay", selection=Selection(destination=loop.dest), actor="ann", source="cli",
        dry_run=dry_run, watch=watch,
    )  # fmt: skip
    return run_action(
        loop.settings.database_url,
        operation,
        deployment=Deployment(loop.settings, loop.registry),
    )


def audit(loop: Loop, audit_id: int | None) -> dict:
    with psycopg.connect(loop.settings.database_url, row_factory=psycopg.rows.dict_row) as conn:
        row = conn.execute("SELECT * FROM retry_dlq_audit WHERE id = %s", (audit_id,)).fetchone()
    assert row is not None
    return row


def replayed_keys(loop: Loop, expected: int) -> list[bytes]:
    """The replayed records on the destination (not the application's own retries coming back)."""
    seen = consume(loop.bootstrap, [loop.dest], expected, timeout_s=15)
    return sorted(
        r.key or b"" for r in seen if r.header(protocol.REPLAYS) == "1" and r.header(protocol.ATTEMPT) == "3"
    )


def test_a_canary_into_a_consumer_still_broken_stops_the_replay_and_leaves_the_rest_dead(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    loop = new_loop(database_url, bootstrap_servers, topic_prefix)
    dead_letters(loop, 30)
    before = {r["id"]: r for r in loop.rows("status = 'dead'")}
    app = App(loop, f"{topic_prefix}-payments", failing=lambda key: True)
    with running_loops(loop), app.running(loop):
        outcome = watched_replay(loop, Watch(canary=5, verdict_s=5, stop_share=0.5))
    assert outcome.stopped is not None and outcome.stopped.startswith("the canary failed: 5 of its 5 records")
    assert "25 not sent, left dead" in outcome.stopped
    assert (outcome.affected, outcome.published, outcome.came_back, outcome.waves) == (5, 5, 5, 2)
    # The canary is the oldest five; the other 25 are dead exactly as they were.
    canary = sorted(before)[:5]
    assert replayed_keys(loop, 5) == sorted(before[i]["msg_key"] for i in canary)
    still_dead = {r["id"]: r for r in loop.rows(f"status = 'dead' AND id <= {max(before)}")}
    assert sorted(still_dead) == sorted(before)[5:]
    for job_id, row in still_dead.items():
        assert (row["dead_reason"], row["attempt"], row["due_at"], row["updated_at"]) == (
            before[job_id]["dead_reason"], before[job_id]["attempt"], before[job_id]["due_at"],
            before[job_id]["updated_at"],
        )  # fmt: skip
    # The canary's records came back: stored again under their retry ids.
    back = loop.rows(f"id > {max(before)}")
    assert {r["retry_id"] for r in back} == {before[i]["retry_id"] for i in canary}
    row = audit(loop, outcome.audit_id)
    assert (row["affected"], row["published"], row["came_back"], row["stopped"]) == (5, 5, 5, outcome.stopped)
    assert row["watch"]["canary"] == 5 and row["finished_at"] is not None
    assert "STOPPED: the canary failed" in outcome.summary()


def test_a_healthy_consumer_gets_the_canary_then_every_wave(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    loop = new_loop(database_url, bootstrap_servers, topic_prefix)
    dead_letters(loop, 24)
    app = App(loop, f"{topic_prefix}-payments", failing=lambda key: False)
    with running_loops(loop), app.running(loop):
        outcome = watched_replay(loop, Watch(canary=4, verdict_s=1, stop_share=0.2, wave=10))
    assert outcome.stopped is None
    assert (outcome.affected, outcome.published, outcome.came_back, outcome.waves) == (24, 24, 0, 3)
    assert loop.rows("status = 'dead'") == []
    assert len(replayed_keys(loop, 24)) == 24
    row = audit(loop, outcome.audit_id)
    assert (row["published"], row["came_back"], row["stopped"]) == (24, 0, None)


def test_a_replay_stops_by_itself_when_too_many_of_a_wave_come_back(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """No canary; half of the first wave fails again (the keys of one shard), more than the 20 %
    allowed: the replay stops after that wave and the two waves after it stay dead."""
    loop = new_loop(database_url, bootstrap_servers, topic_prefix)
    dead_letters(loop, 30)
    app = App(loop, f"{topic_prefix}-payments", failing=lambda key: int(key[1:]) % 2 == 0)
    t0 = time.monotonic()
    with running_loops(loop), app.running(loop):
        outcome = watched_replay(loop, Watch(verdict_s=5, stop_share=0.2, wave=10))
    assert outcome.stopped is not None and outcome.stopped.startswith(
        "5 of 10 published records came back (50%"
    )
    assert (outcome.affected, outcome.published, outcome.came_back) == (10, 10, 5)
    assert "20 not sent, left dead" in outcome.stopped
    assert len(loop.rows("status = 'dead' AND dead_reason = 'exhausted' AND attempt = 2")) == 20
    assert time.monotonic() - t0 < 300


def test_a_wave_the_publish_loop_does_not_send_stops_the_replay_and_stays_pending(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """The ``retry_scheduler`` DAG is paused (no publish loop): the canary is made due and not sent;
    the replay stops after the timeout, its canary pending, the rest dead."""
    loop = new_loop(database_url, bootstrap_servers, topic_prefix)
    dead_letters(loop, 6)
    watch = Watch(canary=2, verdict_s=1, publish_timeout_s=2)
    outcome = watched_replay(loop, watch)
    assert (
        outcome.stopped is not None and "2 records of a wave were not published 2 s after" in outcome.stopped
    )
    assert (
        "is the retry_scheduler DAG running?" in outcome.stopped
        and "4 not sent, left dead" in outcome.stopped
    )
    assert len(loop.rows("status = 'pending'")) == 2 and len(loop.rows("status = 'dead'")) == 4


def test_a_watched_dry_run_says_its_waves_and_changes_nothing(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    loop = new_loop(database_url, bootstrap_servers, topic_prefix)
    dead_letters(loop, 12)
    before = loop.rows()
    outcome = watched_replay(loop, Watch(canary_share=0.25, stop_share=0.1, wave=5), dry_run=True)
    assert (outcome.would_affect, outcome.affected, outcome.waves) == (12, 0, 3)  # 3 (25 %), then 5 and 4
    assert "; watched in 3 waves (a canary of 25% of the replay and a stop above 10% coming back, " in (
        outcome.summary()
    )
    assert loop.rows() == before
    assert audit(loop, outcome.audit_id)["watch"] == {
        "canary": 0, "canary_share": 0.25, "verdict_s": 30.0, "stop_share": 0.1, "wave": 5
    }  # fmt: skip


def cli_loop(
    database_url: str,
    bootstrap_servers: str,
    topic_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    *,
    letters: int,
) -> Loop:
    """A loop with ``letters`` dead letters of its destination, and the environment the command line
    reads them with."""
    loop = new_loop(database_url, bootstrap_servers, topic_prefix)
    dead_letters(loop, letters)
    monkeypatch.setenv("RETRY_DATABASE_URL", database_url)
    monkeypatch.setenv("RETRY_DESTINATION_ALLOWLIST", loop.settings.destination_allowlist or "")
    return loop


def test_the_command_line_watches_a_replay_and_refuses_a_bad_watch(
    database_url: str,
    bootstrap_servers: str,
    topic_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from retry_scheduler.cli.main import main

    loop = cli_loop(database_url, bootstrap_servers, topic_prefix, monkeypatch, letters=4)
    args = ["dlq", "replay", "--destination", loop.dest, "--canary", "2", "--verdict-window", "1s"]

    assert main([*args, "--dry-run"]) == 0
    assert "; watched in 2 waves (a canary of 2 records, each wave watched 1 s after it was published)" in (
        capsys.readouterr().out
    )
    with running_loops(loop):
        assert main([*args, "--yes", "--json"]) == 0
    out = capsys.readouterr().out  # the dry run's JSON, then the run's
    dry, end = json.JSONDecoder().raw_decode(out)
    outcome = json.loads(out[end:])
    assert (dry["dry_run"], dry["waves"], dry["watch"]["canary"]) == (True, 2, 2)
    assert (outcome["affected"], outcome["published"], outcome["came_back"], outcome["stopped"]) == (
        4,
        4,
        0,
        None,
    )
    assert loop.rows("status = 'dead'") == []

    assert main(["dlq", "replay", "--all", "--canary", "lots", "--yes"]) == 2
    assert "canary 'lots' must be a number of records or a share like '5%'" in capsys.readouterr().err
    assert main(["dlq", "replay", "--all", "--verdict-window", "1m", "--yes"]) == 2
    assert "a verdict window needs a canary or a stop share" in capsys.readouterr().err
    assert main(["dlq", "replay", "--reevaluate", "--canary", "5"]) == 2
    assert "watch a replay, not --reevaluate" in capsys.readouterr().err


def test_a_replay_that_stopped_by_itself_exits_3_on_the_command_line(
    database_url: str,
    bootstrap_servers: str,
    topic_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A script must tell a replay that stopped (its canary came back) from one that went through."""
    from retry_scheduler.cli.dlq import EXIT_REPLAY_STOPPED
    from retry_scheduler.cli.main import main

    loop = cli_loop(database_url, bootstrap_servers, topic_prefix, monkeypatch, letters=6)
    app = App(loop, f"{topic_prefix}-payments", failing=lambda key: True)
    with running_loops(loop), app.running(loop):
        code = main(
            ["dlq", "replay", "--destination", loop.dest, "--canary", "2", "--stop-above", "50%",
             "--verdict-window", "5s", "--yes"]
        )  # fmt: skip
    assert code == EXIT_REPLAY_STOPPED == 3
    captured = capsys.readouterr()
    assert "STOPPED: the canary failed" in captured.out
    assert "the replay stopped by itself: the canary failed" in captured.err and "(exit 3)" in captured.err
    assert len(loop.rows(f"status = 'dead' AND destination = '{loop.dest}'")) >= 4  # the rest stays dead
    # Where the docs send operators: the audit says it stopped, and why, without --json.
    assert main(["dlq", "audit", "--limit", "1"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) == 2 and "replay 2 done" in shown[0], shown
    assert "watched: 2 published, 2 came back; STOPPED: the canary failed" in shown[1], shown
