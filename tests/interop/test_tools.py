"""Every tool's dead letters written by the tool itself, on the Apache Kafka 4.4 test broker.

Each test starts a real application of its tool (``tests/interop/*/``, built by Maven once per
machine): a Spring Kafka listener container with ``DefaultErrorHandler`` and
``DeadLetterPublishingRecoverer`` and a ``@RetryableTopic`` listener, a Kafka Connect standalone
worker whose converter cannot read some records, a Kafka Streams topology with KIP-1034's dead-letter
queue, and a Java ``KafkaShareConsumer`` on a share group with the broker's dead-letter topic. Each fails the records whose value starts with
``fail``. The service adopts the letters, and what a user would see is asserted at the sink: the dead
job's original topic, partition, offset, error class and message; ``dlq list --written-by``; a replay
that puts the record back on its partition byte for byte; and ``:retry`` mode, where a record that
always fails comes back by its policy and then dies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from retry_scheduler.cli.main import main
from retry_scheduler.core import protocol as p
from retry_scheduler.core.policy import Policy, PolicyRegistry
from retry_scheduler.db.selection import Selection
from retry_scheduler.ops.dlq import Operation, run_action
from tests.integration.test_loop import Loop, new_loop
from tests.interop.build import java
from tests.kafkautil import Seen, configure_group, consume, create_topics, produce

pytestmark = pytest.mark.integration

#: The records each application reads: the ``fail`` ones fail (the other one is valid JSON, which
#: Connect's converter reads). Their headers, a null and an empty one among them, must come back as
#: they were.
RECORDS = [
    {"key": b"k-1", "value": b"fail-1", "headers": [("tenant", b"acme"), ("empty", b""), ("none", None)]},
    {"key": b"k-2", "value": b'{"ok": 2}', "headers": [("tenant", b"acme")]},
    {"key": b"k-3", "value": b"fail-3 \xff\x00", "headers": []},
]
FAILING = [r for r in RECORDS if r["value"].startswith(b"fail")]
#: The headers each tool adds to its letters (left out when a replay is compared with its original).
TOOL_HEADERS = ("kafka_", "retry_topic-", "__connect.", "__streams.", "__dlq.", p.PREFIX)


class JavaApp:
    """A running interop program: its output in a file, stopped (or killed -9) at the end."""

    def __init__(self, command: list[str], log: Path) -> None:
        self.log = log
        self._out = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(command, stdout=self._out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout_s: float = 90, times: int = 1) -> None:
        """Until ``text`` was printed ``times`` times."""
        deadline = time.monotonic() + timeout_s
        while self.output().count(text) < times:
            assert self.proc.poll() is None, (
                f"the program ended ({self.proc.returncode}):\n{self.output()[-3000:]}"
            )
            assert time.monotonic() < deadline, f"no {text!r} within {timeout_s} s:\n{self.output()[-3000:]}"
            time.sleep(0.2)

    def kill(self) -> None:
        """kill -9: no shutdown hook, no commit."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self._out.close()


@contextlib.contextmanager
def running(command: list[str], log: Path) -> Iterator[JavaApp]:
    app = JavaApp(command, log)
    try:
        yield app
    finally:
        app.stop()


@dataclasses.dataclass(frozen=True)
class Tool:
    """How a tool's application is started and what its letters say."""

    #: The adopted format (RETRY_ADOPT_TOPICS) and ``dlq list --written-by``'s name.
    fmt: str
    #: Its dead-letter topic, from the work topic.
    dlq_of: Callable[[str], str]
    #: The command that runs it: (work topic, dead-letter topic, group or application id, a scratch folder).
    command: Callable[[str, str, str, str, Path], list[str]]
    #: The error class its letter gives for the application's failure.
    error_class: str | None
    #: What the dead job's reason starts with, and what it ends with.
    reason_starts: str
    reason_ends: str = ""


def _connect_command(
    bootstrap: str, work: str, dlq: str, name: str, scratch: Path, rest_port: int = 0
) -> list[str]:
    """Kafka Connect standalone: the worker's and the connector's properties as a team writes them
    (its REST API on ``rest_port``, by default any free one)."""
    worker = scratch / "worker.properties"
    worker.write_text(
        f"bootstrap.servers={bootstrap}\n"
        "key.converter=org.apache.kafka.connect.converters.ByteArrayConverter\n"
        "value.converter=org.apache.kafka.connect.json.JsonConverter\n"
        "value.converter.schemas.enable=false\n"
        f"offset.storage.file.filename={scratch / 'offsets'}\n"
        "offset.flush.interval.ms=60000\n"
        f"listeners=http://127.0.0.1:{rest_port}\n"
        "plugin.discovery=only_scan\n"
    )
    connector = scratch / "sink.properties"
    connector.write_text(
        f"name={name}\n"
        "connector.class=interop.AcceptingSink\n"
        "tasks.max=1\n"
        f"topics={work}\n"
        "consumer.override.auto.offset.reset=earliest\n"
        "errors.tolerance=all\n"
        f"errors.deadletterqueue.topic.name={dlq}\n"
        "errors.deadletterqueue.topic.replication.factor=1\n"
        "errors.deadletterqueue.context.headers.enable=true\n"
    )
    return java(
        "connect", "org.apache.kafka.connect.cli.ConnectStandalone", str(worker), str(connector), heap_mb=384
    )


def tools(bootstrap: str) -> dict[str, Tool]:
    return {
        "spring": Tool(
            "spring",
            lambda work: f"{work}-dlt",  # Spring Kafka 4's default (3.x and before: .DLT)
            lambda work, dlq, group, scratch: java("spring", "SpringDlt", bootstrap, work, group),
            "java.lang.IllegalStateException",  # the cause ListenerExecutionFailedException wraps
            "Listener failed; could not handle fail-",
            "(in org.springframework.kafka.listener.ListenerExecutionFailedException)",
        ),
        # @RetryableTopic: failed once on the topic, once on <topic>-retry, then to <topic>-dlt; its letter
        # holds both places, the topic's first (where the record first failed, and where a replay goes).
        "spring-retryable": Tool(
            "spring",
            lambda work: f"{work}-dlt",
            lambda work, dlq, group, scratch: java("spring", "SpringRetryableTopic", bootstrap, work, group),
            "java.lang.IllegalStateException",
            "Listener failed; could not handle fail-",
            "(in org.springframework.kafka.listener.ListenerExecutionFailedException)",
        ),
        "connect": Tool(
            "connect",
            lambda work: f"{work}.connect-dlq",
            lambda work, dlq, group, scratch: _connect_command(bootstrap, work, dlq, group, scratch),
            "com.fasterxml.jackson.core.JsonParseException",  # named only in the trace: the converter wraps it
            "Converting byte[] to Kafka Connect data failed due to serialization error: Unrecognized token 'fail'",
            "(in org.apache.kafka.connect.errors.DataException)",
        ),
        "streams": Tool(
            "streams",
            lambda work: f"{work}.streams-dlq",
            lambda work, dlq, group, scratch: java(
                "streams", "StreamsDlq", bootstrap, work, f"{work}.out", group, dlq, str(scratch / "state")
            ),
            "java.lang.IllegalStateException",
            "could not handle fail-",
        ),
        "share": Tool(
            "share",
            lambda work: f"dlq.{work}",
            lambda work, dlq, group, scratch: java("share", "RejectingShareConsumer", bootstrap, work, group),
            None,  # a rejection says no more
            "Offset rejected by client.",
        ),
    }


def prepare(loop: Loop, tool: Tool, work: str, group: str) -> str:
    """The work topic (3 partitions), the tool's dead-letter topic and, for a share group, the group's
    dead-letter settings; returns the dead-letter topic."""
    dlq = tool.dlq_of(work)
    create_topics(loop.bootstrap, [work], partitions=3)
    if tool.fmt == "share":
        create_topics(
            loop.bootstrap, [dlq], partitions=1, config={"errors.deadletterqueue.group.enable": "true"}
        )
        configure_group(
            loop.bootstrap, group, share_auto_offset_reset="earliest", errors_deadletterqueue_topic_name=dlq
        )
    elif tool.fmt == "spring":  # Spring writes a letter to its record's partition, which must exist
        create_topics(loop.bootstrap, [dlq], partitions=3)
    if tool.fmt == "streams":
        create_topics(loop.bootstrap, [f"{work}.out"], partitions=3)
    return dlq


def where_they_are(bootstrap: str, work: str) -> dict[bytes, Seen]:
    """The records of the work topic by key: the partition and offset each letter must name."""
    return {s.key: s for s in consume(bootstrap, [work], expected=len(RECORDS))}


def adopted_rows(loop: Loop, dlq: str, letters: int) -> list[dict]:
    counts = loop.ingest(letters, timeout_s=60)
    assert counts.consumed == letters, counts
    return loop.rows(f"source_topic = '{dlq}'")


def replay_adopted(loop: Loop, work: str, dlq: str) -> int:
    """An operator's replay of the adopted letters of ``work`` (as ``dlq replay`` runs it); how many."""
    deployment = loop.allowing(work)
    replay = Operation(action="replay", selection=Selection(dead_reason="adopted", destination=work),
                       actor="ann", source="cli", dry_run=False)  # fmt: skip
    return run_action(loop.settings.database_url, replay, deployment=deployment).affected


@pytest.mark.parametrize("name", ["spring", "spring-retryable", "connect", "streams", "share"])
def test_a_tool_s_own_dead_letters_are_adopted_listed_and_replayed_byte_for_byte(
    database_url: str,
    bootstrap_servers: str,
    topic_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    name: str,
) -> None:
    tool = tools(bootstrap_servers)[name]
    work, group = f"{topic_prefix}-work", f"{topic_prefix}-{name}-app"
    loop = new_loop(database_url, bootstrap_servers, topic_prefix)
    dlq = prepare(loop, tool, work, group)
    loop = dataclasses.replace(loop, settings=loop.settings.with_overrides(adopt_topics={dlq: tool.fmt}))
    produce(bootstrap_servers, work, RECORDS)
    placed = where_they_are(bootstrap_servers, work)

    with running(tool.command(work, dlq, group, tmp_path), tmp_path / f"{name}.log") as app:
        letters = consume(bootstrap_servers, [dlq], expected=len(FAILING), timeout_s=120)
        assert len(letters) == len(FAILING), app.output()[-3000:]
    rows = {
        bytes(r["msg_key"]) if r["msg_key"] is not None else None: r
        for r in adopted_rows(loop, dlq, len(FAILING))
    }
    if name == "share":  # pointer-only letters: completed from the work topic
        assert all(r["msg_key"] is not None for r in rows.values()), rows
    assert sorted(k for k in rows if k) == sorted(r["key"] for r in FAILING), rows
    for record in FAILING:
        row, original = rows[record["key"]], placed[record["key"]]
        assert (row["status"], row["dead_reason"], row["destination"]) == ("dead", "adopted", work)
        assert (row["original_topic"], row["original_partition"], row["original_offset"]) == (
            work, original.partition, original.offset,
        )  # fmt: skip
        assert row["error_class"] == tool.error_class, row["error_class"]
        reason = row["reason"] or ""
        assert reason.startswith(tool.reason_starts) and reason.endswith(tool.reason_ends), reason
        assert bytes(row["msg_value"]) == record["value"]

    # What an operator sees: who wrote each letter.
    monkeypatch.setenv("RETRY_DATABASE_URL", database_url)
    monkeypatch.setenv("RETRY_ADOPT_TOPICS", f"{dlq}={tool.fmt}")
    assert main(["dlq", "list", "--written-by", tool.fmt, "--destination", work, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["jobs"]
    assert sorted(j["id"] for j in listed) == sorted(r["id"] for r in rows.values())
    assert {j["written_by"] for j in listed} == {tool.fmt}

    assert replay_adopted(loop, work, dlq) == len(FAILING)
    loop.publish(3)
    seen = consume(bootstrap_servers, [work], expected=len(RECORDS) + len(FAILING))
    replayed = {s.key: s for s in seen if s.header(p.ATTEMPT) is not None}
    assert sorted(replayed) == sorted(r["key"] for r in FAILING)
    for record in FAILING:
        again, original = replayed[record["key"]], placed[record["key"]]
        assert (again.value, again.partition) == (record["value"], original.partition)
        own = [(k, v) for k, v in again.headers if not k.startswith(TOOL_HEADERS)]
        assert own == record["headers"]  # byte for byte, in order, the null and the empty one included


@pytest.mark.parametrize("name", ["spring", "connect", "streams", "share"])
def test_a_record_that_always_fails_in_a_tool_comes_back_by_its_policy_then_dies(
    database_url: str, bootstrap_servers: str, topic_prefix: str, tmp_path: Path, name: str
) -> None:
    """Adopted ``:retry``: each letter of the record is scheduled by the destination's policy and
    published back to the work topic, where the running application fails it again and writes its next
    letter, carrying the ``retry.attempt`` it came back with: attempts 0, 1, 2, then dead."""
    max_attempts = 2
    tool = tools(bootstrap_servers)[name]
    work, group = f"{topic_prefix}-work", f"{topic_prefix}-{name}-app"
    loop = new_loop(database_url, bootstrap_servers, topic_prefix)
    dlq = prepare(loop, tool, work, group)
    loop = dataclasses.replace(
        loop,
        settings=loop.settings.with_overrides(adopt_topics={dlq: f"{tool.fmt}:retry"}),
        registry=PolicyRegistry.of([Policy("default", delays=["1s"], max_attempts=max_attempts)]),
    )
    produce(
        bootstrap_servers,
        work,
        [{"key": b"always", "value": b"fail-always", "headers": [("tenant", b"acme")]}],
    )
    with running(tool.command(work, dlq, group, tmp_path), tmp_path / f"{name}.log") as app:
        for letter in range(1, max_attempts + 2):
            got = consume(bootstrap_servers, [dlq], expected=letter, timeout_s=120)
            assert len(got) >= letter, f"letter {letter} not written:\n{app.output()[-3000:]}"
            loop.ingest(1, timeout_s=60)
            newest = loop.rows(f"source_topic = '{dlq}'")[-1]
            if newest["status"] == "dead":
                break
            loop.publish(3)
            assert loop.rows(f"id = {newest['id']}")[0]["status"] == "published"
    rows = loop.rows(f"source_topic = '{dlq}'")
    assert [r["attempt"] for r in rows] == list(range(max_attempts + 1)), rows
    assert [r["status"] for r in rows] == ["published"] * max_attempts + ["dead"]
    assert rows[-1]["dead_reason"] == "exhausted"
    assert len({r["retry_id"] for r in rows}) == 1  # one failure, followed through each letter
    assert {r["original_topic"] for r in rows} == {work}


@pytest.mark.parametrize("name", ["connect", "streams"])
def test_a_tool_killed_before_it_commits_writes_its_letters_again_identified_as_duplicates(
    database_url: str, bootstrap_servers: str, topic_prefix: str, tmp_path: Path, name: str
) -> None:
    """The Connect worker (offsets flushed every minute) or the Streams instance (commits every minute)
    is killed -9 after writing its letters and before committing: started again, it reads the same
    records and writes their letters again. Nothing is lost (the good record reaches the sink), and
    each record's two letters are one failure: the same retry.id, so their replays are duplicates a
    consumer can tell (same retry.id and retry.attempt)."""
    tool = tools(bootstrap_servers)[name]
    work, group = f"{topic_prefix}-work", f"{topic_prefix}-{name}-app"
    loop = new_loop(database_url, bootstrap_servers, topic_prefix)
    dlq = prepare(loop, tool, work, group)
    loop = dataclasses.replace(loop, settings=loop.settings.with_overrides(adopt_topics={dlq: tool.fmt}))
    produce(bootstrap_servers, work, RECORDS)
    placed = where_they_are(bootstrap_servers, work)
    sink = f"{work}.out"

    def good_ones(app: JavaApp) -> int:
        """How many times the good record reached the sink."""
        if name == "connect":
            k2 = placed[b"k-2"]
            return app.output().count(f"sank {work} {k2.partition} {k2.offset}")
        return sum(s.key == b"k-2" for s in consume(bootstrap_servers, [sink], expected=99, timeout_s=3))

    with running(tool.command(work, dlq, group, tmp_path), tmp_path / f"{name}-1.log") as first:
        assert len(consume(bootstrap_servers, [dlq], expected=len(FAILING), timeout_s=120)) == len(FAILING)
        deadline = time.monotonic() + 60
        while good_ones(first) < 1:
            assert time.monotonic() < deadline, first.output()[-3000:]
            time.sleep(0.5)
        first.kill()
    with running(tool.command(work, dlq, group, tmp_path), tmp_path / f"{name}-2.log") as second:
        again = consume(bootstrap_servers, [dlq], expected=2 * len(FAILING), timeout_s=120)
        assert len(again) == 2 * len(FAILING), second.output()[-3000:]
        if name == "connect":
            second.wait_for(f"sank {work} ", timeout_s=60)

    rows = adopted_rows(loop, dlq, 2 * len(FAILING))
    for record in FAILING:
        original = placed[record["key"]]
        letters = [
            r
            for r in rows
            if (r["original_partition"], r["original_offset"]) == (original.partition, original.offset)
        ]
        assert len(letters) == 2, rows
        assert len({r["retry_id"] for r in letters}) == 1  # one failure, two letters
        assert all(bytes(r["msg_value"]) == record["value"] for r in letters)
    assert len({r["retry_id"] for r in rows}) == len(FAILING)

    assert replay_adopted(loop, work, dlq) == 2 * len(FAILING)
    loop.publish(3)
    seen = consume(bootstrap_servers, [work], expected=len(RECORDS) + 2 * len(FAILING))
    replayed = [s for s in seen if s.header(p.ATTEMPT) is not None]
    for record in FAILING:
        copies = [s for s in replayed if s.key == record["key"]]
        assert len(copies) == 2 and copies[0].value == copies[1].value == record["value"]
        # a duplicate a consumer can tell: the same retry.id and the same attempt
        assert len({(s.header(p.ID), s.header(p.ATTEMPT)) for s in copies}) == 1


def test_a_connect_task_restarted_through_its_rest_api_loses_nothing_and_writes_each_letter_once(
    database_url: str, bootstrap_servers: str, topic_prefix: str, tmp_path: Path
) -> None:
    """An operator restarts the sink task (``POST /connectors/<name>/tasks/0/restart``, Connect's own
    REST API) after it wrote its letters, long before its next offset flush (a minute). The task
    commits what it handled, failed records included, as it closes: started again, it reads on from
    there. Nothing is lost (records sent after the restart are sunk or lettered), and no letter is
    written twice; the letters of both rounds are adopted as one failure each. (A worker killed -9
    commits nothing: that one writes its letters again, see the test above.)"""
    import urllib.request

    from retry_scheduler.dev.procs import free_port

    tool = tools(bootstrap_servers)["connect"]
    work, group = f"{topic_prefix}-work", f"{topic_prefix}-connect-app"
    loop = new_loop(database_url, bootstrap_servers, topic_prefix)
    dlq = prepare(loop, tool, work, group)
    loop = dataclasses.replace(loop, settings=loop.settings.with_overrides(adopt_topics={dlq: tool.fmt}))
    produce(bootstrap_servers, work, RECORDS)

    def call(url: str, method: str = "GET") -> tuple[int, bytes]:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=30) as answer:
            return answer.status, answer.read()

    port = free_port()
    command = _connect_command(bootstrap_servers, work, dlq, group, tmp_path, rest_port=port)
    with running(command, tmp_path / "connect.log") as app:
        assert len(consume(bootstrap_servers, [dlq], expected=len(FAILING), timeout_s=120)) == len(FAILING)
        app.wait_for(f"sank {work} ", timeout_s=60)
        status, _body = call(f"http://127.0.0.1:{port}/connectors/{group}/tasks/0/restart", "POST")
        assert status in (200, 202, 204), status
        app.wait_for("task stopped", timeout_s=60)
        app.wait_for("task started", timeout_s=60, times=2)
        state = json.loads(call(f"http://127.0.0.1:{port}/connectors/{group}/status")[1])["tasks"][0]
        assert state["state"] == "RUNNING", state
        produce(bootstrap_servers, work, RECORDS)  # the second round, read by the restarted task
        letters = consume(bootstrap_servers, [dlq], expected=2 * len(FAILING), timeout_s=120)
        app.wait_for(f"sank {work} ", timeout_s=60, times=2)

    placed = {}
    for seen in consume(bootstrap_servers, [work], expected=2 * len(RECORDS)):
        placed.setdefault(seen.key, []).append((seen.partition, seen.offset))
    # Each failed record of each round was lettered exactly once, by the offset it had in its topic.
    named = sorted(
        (int(s.header("__connect.errors.partition") or -1), int(s.header("__connect.errors.offset") or -1))
        for s in letters
    )
    failed = sorted(where for record in FAILING for where in placed[record["key"]])
    assert named == failed, (named, failed)
    # The good record of each round reached the sink once.
    output = app.output()
    for partition, offset in placed[b"k-2"]:
        assert output.count(f"sank {work} {partition} {offset}") == 1, output[-3000:]

    rows = adopted_rows(loop, dlq, 2 * len(FAILING))
    assert len({r["retry_id"] for r in rows}) == 2 * len(FAILING)  # four failures, none a duplicate


def java_producer_places(bootstrap: str, topic: str, records: dict[str, str], log: Path) -> dict[str, int]:
    """Sends ``records`` (key: value) with Java's own partitioner; the partition each key went to."""
    done = subprocess.run(
        java("docs-client", "DocsClient", "produce", bootstrap, topic, *(f"{k}={v}" for k, v in records.items())),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    log.write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    return {
        line.split()[1]: int(line.split()[2]) for line in done.stdout.splitlines() if line.startswith("sent ")
    }


def test_the_docs_java_client_fails_a_record_three_times_and_it_dies_by_its_policy(
    database_url: str, bootstrap_servers: str, topic_prefix: str, tmp_path: Path
) -> None:
    """The header protocol document's Java example, compiled from the document: each failure copies the
    failed record's headers (ours among them) and adds its own again; the last occurrence counts, the
    record comes back each time on the partition Java's partitioner chose, and dies by its policy."""
    # The example sends to the topic "retry": the loop reads that name here (its group is the test's own).
    loop = new_loop(database_url, bootstrap_servers, topic_prefix, retry_topic="retry")
    orders = f"{topic_prefix}-orders"
    loop = dataclasses.replace(
        loop, registry=PolicyRegistry.of([Policy("default", delays=["1s"], max_attempts=3)])
    )
    create_topics(bootstrap_servers, [orders], partitions=6)
    with contextlib.suppress(Exception):  # another test of the session made it
        create_topics(bootstrap_servers, ["retry"], partitions=1)
    placed = java_producer_places(
        bootstrap_servers,
        orders,
        {f"order-{i}": ("fail" if i == 4 else "ok") for i in range(8)},
        tmp_path / "p.log",
    )
    assert len(set(placed.values())) > 1  # Java spread the keys over the partitions
    client = java(
        "docs-client", "DocsClient", "consume", bootstrap_servers, orders, f"{topic_prefix}-orders-app"
    )
    mine = f"original_topic = '{orders}'"
    with running(client, tmp_path / "client.log") as app:
        for failure in range(1, 5):
            app.wait_for(f"retried {placed['order-4']} ", timeout_s=90, times=failure)
            while len(loop.rows(mine)) < failure:  # other tests' records may share the topic "retry"
                loop.ingest(1, timeout_s=30)
            newest = loop.rows(mine)[-1]
            if newest["status"] == "dead":
                break
            loop.publish(3)
    rows = loop.rows(mine)
    assert {bytes(r["msg_key"]) for r in rows} == {b"order-4"}
    assert [r["attempt"] for r in rows] == [0, 1, 2, 3], rows
    assert [r["status"] for r in rows] == ["published"] * 3 + ["dead"]
    assert len({r["retry_id"] for r in rows}) == 1
    back = [s for s in consume(bootstrap_servers, [orders], expected=8 + 3) if s.key == b"order-4"]
    assert {s.partition for s in back} == {placed["order-4"]}  # where Java's partitioner put the key
    assert [s.header(p.ATTEMPT) for s in back] == [None, "1", "2", "3"]
    # The dead one replayed by an operator lands there too.
    deployment = loop.allowing(orders)
    replay = Operation(action="replay", selection=Selection(destination=orders), actor="ann", source="cli",
                       dry_run=False)  # fmt: skip
    assert run_action(loop.settings.database_url, replay, deployment=deployment).affected == 1
    loop.publish(3)
    back = [s for s in consume(bootstrap_servers, [orders], expected=8 + 4) if s.key == b"order-4"]
    assert len(back) == 5 and back[-1].partition == placed["order-4"] and back[-1].value == b"fail"
