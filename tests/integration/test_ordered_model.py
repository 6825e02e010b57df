"""Ordered mode's guarantee, attacked by a model-based test (issue 29).

A seeded simulation drives the real parts (the consumer helper, 1 to 4 members of one group in ordered
mode; the scheduler's ingest and publish loops; Apache Kafka 4.4; PostgreSQL) through a random
interleaving of: records sent, records failing once or twice, failing for good (their retries die)
and failing fatally; the publisher dying after the broker acknowledged a round (its jobs published
again: duplicates); a member killed at each of its checkpoints (after a retry, a park or a release
was sent, after a hold was written, before an offset was committed) and another taking over; members
joining and leaving (rebalances: partitions and their holds move); the scheduler restarted, and its
ingest killed between reading a batch and storing it.

A kill is what SIGKILL leaves behind for the broker, PostgreSQL and the holds topic: the member's
consumer is dropped, not closed (librdkafka destroys it without ``consumer_close``: no offset
committed, no rebalance callback, no LeaveGroup), so the group learns of it only when its session
times out, and the member's other objects are never used again. A leave is a member closed (it
commits nothing more and says LeaveGroup). Odd seeds have one member, killed at its checkpoints, a
new one taking its place; even seeds have up to 4 members that join, are killed while others stay,
and leave, at any moment: a leave or a kill in the middle of a rebalance included.

Every seed runs under both rebalance protocols: the classic one (eager, the ``range`` assignor the
helper needs in ordered mode) and KIP-848's consumer protocol (``group.protocol=consumer``: the
broker assigns, incrementally, with its ``range`` assignor, which the helper asks for), the group's
session 6 s and heartbeat 0.5 s in both.

The oracle, after every run: for every key, the handler's successful calls are the key's records in
their original order, all but those that died, none lost; a record handled twice in a row is allowed
only where a member was killed after handling it and before committing it (Kafka's at-least-once), so
there are never more such repeats than kills. At the end no job may be pending and no member may
hold a key: a key whose last head died with nothing parked behind it is freed by the scheduler's
notice. ``RETRY_MODEL_SEEDS`` (comma-separated) picks the seeds: ``make test`` runs 11 and 12 (one of
each kind, under both protocols; 13 and 14 took 5 test-minutes more), ``make
chaos-ordered`` runs 20 more (101 to 120), ``CHAOS_ORDERED_SEEDS`` others.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import Message, TopicPartition

from retry_scheduler.consumer import RetryingConsumer
from retry_scheduler.core import protocol
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.db.chains import release_chains
from retry_scheduler.db.connection import database_lost
from retry_scheduler.db.store import Store
from retry_scheduler.dev.kafka_cluster import KafkaCluster
from retry_scheduler.loops.ingest import Ingestor
from retry_scheduler.loops.publish import Publisher
from tests.integration.test_loop import Loop, new_loop
from tests.kafkautil import QUICK_JOIN, configure_group, consume, create_topics, produce

pytestmark = pytest.mark.integration

SEEDS = [int(s) for s in os.environ.get("RETRY_MODEL_SEEDS", "11,12").split(",") if s.strip()]
#: The kinds of fault injected: members killed at their checkpoints (arm: an odd seed's one member, a
#: new one taking over; an even seed's members while others stay), members joining and leaving (even
#: seeds, up to MAX_MEMBERS); the scheduler restarted, its ingest and its publisher killed.
#: RETRY_MODEL_FAULTS (comma-separated) narrows them: arm, join, leave, restart, kill-ingest,
#: kill-publish.
#: RETRY_MODEL_CLUSTER=1 (``make chaos-ordered CLUSTER=1``): the members, the scheduler and their
#: topics on three Kafka brokers and two controllers only, every topic with three replicas, and one
#: more kind of fault, ``cluster``: a broker failing as in ``make chaos-cluster`` (CLUSTER_KINDS).
CLUSTER = os.environ.get("RETRY_MODEL_CLUSTER") == "1"
KINDS = set(
    os.environ.get(
        "RETRY_MODEL_FAULTS",
        "arm,join,leave,restart,kill-ingest,kill-publish" + (",cluster" if CLUSTER else ""),
    ).split(",")
)
#: What a ``cluster`` fault does (one at a time, in a thread of its own while the model steps on):
#: the leader of a destination or retry-topic partition, the members' group coordinator or the
#: active controller killed (-9) and started again 2-8 s later; every broker restarted in turn; two
#: brokers stopped for 3-10 s; a destination partition's leader frozen for 10-15 s.
CLUSTER_KINDS = (
    "leader_kill_destination",
    "leader_kill_retry",
    "coordinator_kill",
    "controller_kill",
    "rolling_restart",
    "two_brokers_down",
    "broker_freeze",
)
KEYS, PER_KEY = 4, 6
#: Even seeds: at most this many members at once.
MAX_MEMBERS = 4
#: The rebalance protocols every seed runs under (``group.protocol``).
PROTOCOLS = ("classic", "consumer")
#: Where a member is killed: right after sending a retry, a park or a dead letter; right after writing
#: a hold; just before sending a release, and right after; just before committing an offset.
MEMBER_CHECKPOINTS = ("sent", "hold", "before-release", "after-release", "before-commit")


class Crash(BaseException):
    """A member or loop killed at a checkpoint (BaseException: nothing of ours catches it)."""


@dataclass
class App:
    """The application: each record's value is its place in its key's order. ``plan[(key, n)]``: how
    many times it fails before it succeeds, ``"always"`` (its retries die) or ``"fatal"``."""

    plan: dict[tuple[bytes, int], Any]
    calls: Counter[tuple[bytes, int]] = field(default_factory=Counter)
    handled: dict[bytes, list[int]] = field(default_factory=lambda: defaultdict(list))

    #: Records without a value handed to the handler (a scheduler's notice must never be).
    valueless: int = 0

    def handle(self, msg: Message) -> None:
        key, value = msg.key(), msg.value()
        assert isinstance(key, bytes)
        if value is None:
            self.valueless += 1
            return
        record = (key, int(value))
        self.calls[record] += 1
        fate = self.plan.get(record, 0)
        if fate == "fatal":
            raise ValueError(f"{record}: not a ledger entry")
        if fate == "always" or self.calls[record] <= fate:
            raise TimeoutError(f"{record}: the ledger is not there yet")
        self.handled[key].append(record[1])

    def dead(self) -> set[tuple[bytes, int]]:
        return {record for record, fate in self.plan.items() if fate in ("always", "fatal")}


class CommitProxy:
    """The member's consumer, with a checkpoint before each commit."""

    def __init__(self, real: Any, member: Member) -> None:
        self._real, self._member = real, member

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        self._member.reach("before-commit")
        return self._real.commit(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class Member:
    """One member of the group: a :class:`RetryingConsumer` in ordered mode whose sends, hold writes and
    commits pass through checkpoints where it can be killed."""

    def __init__(self, name: str, config: dict[str, Any], loop: Loop, app: App, holds_topic: str) -> None:
        self.name = name
        self.armed: str | None = None
        self.helper = RetryingConsumer(config, [loop.dest], app.handle, ordered=True, holds_topic=holds_topic)
        self.helper.retries.retry_topic = loop.settings.retry_topic
        self.helper.retries.fatal_errors = (ValueError,)
        self._after(self.helper.retries, "retry", "sent")
        self._around(self.helper.retries, "release", "before-release", "after-release")
        assert self.helper.hold_store is not None
        self._after(self.helper.hold_store, "put", "hold")
        self.helper.consumer = CommitProxy(self.helper.consumer, self)  # type: ignore[assignment]

    def reach(self, point: str) -> None:
        if self.armed == point:
            self.armed = None
            raise Crash(f"{self.name} killed at {point}")

    def _after(self, obj: Any, name: str, point: str) -> None:
        real: Callable[..., Any] = getattr(obj, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            out = real(*args, **kwargs)
            self.reach(point)
            return out

        setattr(obj, name, wrapper)

    def _around(self, obj: Any, name: str, before: str, after: str) -> None:
        real: Callable[..., Any] = getattr(obj, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.reach(before)
            out = real(*args, **kwargs)
            self.reach(after)
            return out

        setattr(obj, name, wrapper)

    def kill(self) -> None:
        """What a SIGKILL leaves: nothing committed, nothing more sent, no LeaveGroup. The consumer's
        one reference is dropped: CPython destroys it at once, and librdkafka's destroy of a consumer
        never closed skips ``consumer_close`` (no commit, no callback, no LeaveGroup); the group learns
        of it when its session times out. The member object is never used again."""
        proxy: Any = self.helper.consumer
        proxy._real = None

    def leave(self) -> None:
        """A member stopped by its operator: closed (LeaveGroup), its partitions go to the others."""
        self.helper.close()


class Scheduler:
    """The ingest and publish loops, stepped one batch and one round at a time."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.ingest_store = Store(loop.settings.database_url)
        self.publish_store = Store(loop.settings.database_url)
        self.ingestor = Ingestor(Deployment(loop.settings, loop.registry), self.ingest_store)
        self.publisher = Publisher(Deployment.load(loop.settings), self.publish_store)

    def ingest(self, kill: bool) -> None:
        batch = self.ingestor.read_batch(0.2)
        if batch is None:
            return
        if kill:  # read, not stored: the process dies with the batch
            raise Crash("ingest killed between reading a batch and storing it")
        self.ingestor._finish(batch, self.ingestor.store_batch(batch))

    def publish(self, kill: bool) -> None:
        if not kill:
            self.publisher.publish_once()
            return
        real = self.publish_store.queue.mark_published

        def acknowledged_then_killed(*args: Any, **kwargs: Any) -> Any:
            raise Crash("publisher killed after the broker acknowledged its round")

        self.publish_store.queue.mark_published = acknowledged_then_killed  # type: ignore[method-assign]
        try:
            self.publisher.publish_once()
        finally:
            self.publish_store.queue.mark_published = real  # type: ignore[method-assign]

    def close(self) -> None:
        for close in (
            self.ingestor.close,
            self.publisher.close,
            self.ingest_store.close,
            self.publish_store.close,
        ):
            with contextlib.suppress(Exception):  # a loop killed mid-way: what is left of it goes
                close()


@dataclass
class Run:
    seed: int
    protocol: str = "classic"
    faults: Counter[str] = field(default_factory=Counter)
    steps: int = 0


class ClusterFaults:
    """Strikes the cluster under the model (the ``cluster`` kind), one fault at a time, each in a
    thread that leaves every node running again when it ends."""

    def __init__(self, cluster: KafkaCluster, loop: Loop, group: str) -> None:
        self.cluster, self.loop, self.group = cluster, loop, group
        self.thread: threading.Thread | None = None
        self.errors: list[str] = []

    @property
    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def strike(self, kind: str, rng: random.Random) -> None:
        cluster, down_s = self.cluster, rng.uniform(2, 8)
        partition = rng.randrange(2)

        def body() -> None:
            try:
                if kind in ("leader_kill_destination", "leader_kill_retry", "broker_freeze"):
                    topic = self.loop.settings.retry_topic if kind == "leader_kill_retry" else self.loop.dest
                    node = cluster.leader(topic, partition)
                    if kind == "broker_freeze":
                        cluster.freeze(node)
                        time.sleep(rng.uniform(10, 15))
                        cluster.thaw(node)
                    else:
                        cluster.kill(node)
                        time.sleep(down_s)
                        cluster.restart(node)
                elif kind in ("coordinator_kill", "controller_kill"):
                    node = (
                        cluster.coordinator(self.group)
                        if kind == "coordinator_kill"
                        else cluster.controller()
                    )
                    cluster.kill(node)
                    time.sleep(down_s)
                    cluster.restart(node)
                elif kind == "rolling_restart":
                    for each in [n.node_id for n in cluster.broker_nodes]:
                        cluster.stop(each)
                        cluster.restart(each)
                else:  # two_brokers_down
                    down = rng.sample([n.node_id for n in cluster.broker_nodes], 2)
                    for each in down:
                        cluster.stop(each)
                    time.sleep(rng.uniform(3, 10))
                    for each in down:
                        cluster.restart(each)
            except (
                Exception
            ) as exc:  # the harness could not strike (a node it asks is down): said in the report
                self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
            finally:
                cluster.start(announce=False)

        self.thread = threading.Thread(target=body, name=f"cluster-{kind}", daemon=True)
        self.thread.start()

    def settle(self) -> None:
        """Wait for the fault in hand to end (every node running again)."""
        if self.thread is not None:
            self.thread.join(120)


@pytest.fixture(scope="module")
def model_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster | None]:
    """With RETRY_MODEL_CLUSTER=1, the module's Kafka cluster; else None."""
    if not CLUSTER:
        yield None
        return
    with KafkaCluster(
        tmp_path_factory.mktemp("model-cluster"), 3, controllers=2, say=lambda _m: None
    ) as cluster:
        cluster.start()
        yield cluster


@pytest.fixture
def model_bootstrap(request: pytest.FixtureRequest, model_cluster: KafkaCluster | None) -> str:
    """The model's brokers: the cluster's, or the tests' one broker."""
    if model_cluster is not None:
        return model_cluster.bootstrap
    return str(request.getfixturevalue("bootstrap_servers"))


def new_world(
    database_url: str, bootstrap_servers: str, topic_prefix: str, group_protocol: str = "classic"
) -> tuple[Loop, dict[str, Any], str]:
    """The scheduler's loop and its topics (2 partitions each), the members' consumer config (under
    ``group_protocol``, a member killed found out after 6 s either way), the holds topic."""
    loop = new_loop(
        database_url, bootstrap_servers, topic_prefix, destination_allowlist=rf"^{topic_prefix}-orders$"
    )
    group = f"{topic_prefix}-billing"
    create_topics(loop.bootstrap, [loop.dest, loop.settings.retry_topic, f"{topic_prefix}-dlq"], partitions=2)
    create_topics(loop.bootstrap, [f"{loop.dest}.{group}.redelivery"], partitions=2)
    config = {"bootstrap.servers": loop.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
              "topic.metadata.refresh.interval.ms": 1000}  # fmt: skip
    if group_protocol == "consumer":  # the session is the broker's: the group's own configuration
        configure_group(loop.bootstrap, group, consumer_session_timeout_ms="6000",
                        consumer_heartbeat_interval_ms="500")  # fmt: skip
        config["group.protocol"] = "consumer"
    else:
        config.update(QUICK_JOIN)
    return loop, config, f"{topic_prefix}-holds"


def plan_for(rng: random.Random) -> dict[tuple[bytes, int], Any]:
    plan: dict[tuple[bytes, int], Any] = {}
    for k in range(KEYS):
        for n in range(PER_KEY):
            fate = rng.choices([0, 1, 2, "always", "fatal"], weights=[55, 25, 10, 5, 5])[0]
            if fate:
                plan[(f"k{k}".encode(), n)] = fate
    return plan


def violations(app: App, run: Run) -> list[str]:
    """The oracle: each key's records handled in their original order, each once but for a repeat
    right after a kill, all but the dead ones. What it found wrong (nothing, when the guarantee held)."""
    dead = app.dead()
    found, repeats = [], 0
    for k in range(KEYS):
        key = f"k{k}".encode()
        got = app.handled[key]
        distinct = [n for i, n in enumerate(got) if i == 0 or got[i - 1] != n]
        repeats += len(got) - len(distinct)
        want = [n for n in range(PER_KEY) if (key, n) not in dead]
        if distinct != want:
            found.append(f"key {key!r} handled {got}, want {want}")
    if app.valueless:
        found.append(f"{app.valueless} record(s) without a value (notices) handed to the handler")
    kills = sum(n for fault, n in run.faults.items() if fault.startswith(("member killed", "offset commit")))
    if repeats > kills:
        found.append(f"{repeats} records handled again, only {kills} kills and failed commits")
    return found


def report(run: Run, found: list[str], finished: bool) -> None:
    """With ``RETRY_MODEL_REPORT`` set (``make chaos-ordered``): one JSON line per run appended there."""
    path = os.environ.get("RETRY_MODEL_REPORT")
    if path:
        line = {"seed": run.seed, "protocol": run.protocol, "cluster": CLUSTER, "keys": KEYS, "records": KEYS * PER_KEY, "steps": run.steps,
                "finished": finished, "violations": found, "faults": dict(run.faults)}  # fmt: skip
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


@pytest.mark.long
@pytest.mark.parametrize("group_protocol", PROTOCOLS)
@pytest.mark.parametrize("seed", SEEDS)
def test_every_key_keeps_its_order_under_random_faults(
    seed: int,
    group_protocol: str,
    database_url: str,
    model_bootstrap: str,
    model_cluster: KafkaCluster | None,
    topic_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rng = random.Random(seed)
    single = seed % 2 == 1  # one member, killed at its checkpoints; else up to MAX_MEMBERS
    loop, config, holds_topic = new_world(database_url, model_bootstrap, topic_prefix, group_protocol)
    cluster = None if model_cluster is None else ClusterFaults(model_cluster, loop, config["group.id"])
    app = App(plan_for(rng))
    records = [
        {"key": f"k{k}".encode(), "value": str(n).encode()} for n in range(PER_KEY) for k in range(KEYS)
    ]
    run = Run(seed, group_protocol)
    scheduler = Scheduler(loop)
    members: list[Member] = []
    gone: list[Member] = []
    names = iter(f"m{i}" for i in range(1000))

    def join() -> None:
        members.append(Member(next(names), config, loop, app, holds_topic))

    def kill(member: Member, why: str) -> None:
        run.faults[why if single or len(members) == 1 else f"{why} (others stayed)"] += 1
        member.kill()
        members.remove(member)
        gone.append(member)
        if not members:
            join()  # a restart

    def leave() -> None:
        member = rng.choice(members)
        run.faults["member left"] += 1
        member.leave()
        members.remove(member)
        gone.append(member)

    def restart_scheduler(why: str) -> None:
        nonlocal scheduler
        run.faults[why] += 1
        scheduler.close()
        scheduler = Scheduler(loop)

    def step(faults: bool) -> None:
        run.steps += 1
        action = rng.choices(
            ["poll", "ingest", "publish", "send", "arm", "join", "leave", "restart", "cluster"],
            weights=[40, 12, 12, 6 if sent < len(records) else 0, 3 if faults and "arm" in KINDS else 0,
                     2 if faults and not single and "join" in KINDS else 0,
                     2 if faults and not single and len(members) > 1 and "leave" in KINDS else 0,
                     1 if faults and "restart" in KINDS else 0,
                     1 if faults and cluster is not None and not cluster.busy and "cluster" in KINDS else 0],
        )[0]  # fmt: skip
        if action == "poll":
            member = rng.choice(members)
            try:
                member.helper.poll(0.05)
            except Crash as crash:
                kill(member, f"member killed {str(crash).split(' at ')[1]}")
        elif action == "ingest":
            try:
                scheduler.ingest(kill=faults and "kill-ingest" in KINDS and rng.random() < 0.05)
            except Crash:
                restart_scheduler("ingest killed with a batch read")
            except Exception as exc:
                if not database_lost(exc):
                    raise
                restart_scheduler("scheduler lost its database (reconnected)")
        elif action == "publish":
            try:
                scheduler.publish(kill=faults and "kill-publish" in KINDS and rng.random() < 0.1)
            except Crash:
                run.faults["publisher killed after the acks (duplicates)"] += 1
            except Exception as exc:
                # A round held past the lease by a broker's failure: the server ends its transaction,
                # and the loop connects again (loops.runners.reconnecting), as a new scheduler here.
                if not database_lost(exc):
                    raise
                restart_scheduler("scheduler lost its database (reconnected)")
        elif action == "arm":
            rng.choice(members).armed = rng.choice(MEMBER_CHECKPOINTS)
        elif action == "join" and len(members) < MAX_MEMBERS:
            run.faults["member joined"] += 1
            join()
        elif action == "leave":
            leave()
        elif action == "restart":
            restart_scheduler("scheduler restarted")
        elif action == "cluster" and cluster is not None:
            kind = rng.choice(CLUSTER_KINDS)
            run.faults[f"cluster: {kind}"] += 1
            cluster.strike(kind, rng)

    def finished() -> bool:
        dead = app.dead()
        want = {(f"k{k}".encode(), n) for k in range(KEYS) for n in range(PER_KEY)} - dead
        if not want <= {(key, n) for key, ns in app.handled.items() for n in ns}:
            return False
        with Store(loop.settings.database_url) as store:
            pending = store.conn.execute(
                "SELECT count(*) FROM retry_jobs WHERE status = 'pending'"
            ).fetchone()
        held = {where: hold for m in members for where, hold in owned_holds(m).items()}
        return pending == (0,) and not held

    def owned_holds(member: Member) -> dict[tuple[str, bytes], Any]:
        """The member's held keys of the partitions it reads (its copies of others' may be old)."""
        mine = {partition for topic, partition in member.helper.assigned if topic == loop.dest}
        return {w: h for w, h in member.helper.holds.items() if h.partition in mine}

    def diagnosis() -> str:
        with Store(loop.settings.database_url) as store:
            rows = store.conn.execute(
                "SELECT msg_key, msg_value, status, held_by, due_at < '9999-01-01', attempt, dead_reason "
                "FROM retry_jobs ORDER BY id"
            ).fetchall()
            chains = store.conn.execute("SELECT blocker, why, head FROM retry_released_holds").fetchall()
        owned = {m.name: owned_holds(m) for m in members}
        return f"rows {rows}\nreleased {chains}\nowned holds {owned}\ncounts {[(m.name, m.helper.ordered.counts) for m in members + gone if m.helper.ordered]}"

    sent = 0
    join()
    try:
        with (
            caplog.at_level(logging.WARNING),
            caplog.at_level(logging.INFO, logger="retry_scheduler.ordered"),
        ):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (
                sent == len(records) and run.steps % 50 == 0 and finished()
            ):
                if sent < len(records) and rng.random() < 0.15:
                    batch = records[sent : sent + rng.randint(1, 4)]
                    produce(loop.bootstrap, loop.dest, batch)
                    sent += len(batch)
                step(faults=True)
            for member in members:
                member.armed = None
            if cluster is not None:
                cluster.settle()  # every broker back before the quiet part
                for error in cluster.errors:  # not struck: the harness's failure, not the service's
                    run.faults[f"cluster fault not struck: {error.split(':')[0]}"] += 1
            deadline = time.monotonic() + 150  # then quiet: everything comes back
            while time.monotonic() < deadline and not (run.steps % 25 == 0 and finished()):
                if sent < len(records):
                    produce(loop.bootstrap, loop.dest, records[sent:])
                    sent = len(records)
                step(faults=False)
            done = finished()
            if not done:
                report(run, violations(app, run), finished=False)
            assert done, (
                f"seed {seed} ({group_protocol}): not finished in time ({run.faults}, handled {dict(app.handled)}, members "
                f"{[m.name for m in members]})\n{diagnosis()}\nthe log ends:\n{caplog.text[-20000:]}"
            )
    finally:
        if cluster is not None:
            cluster.settle()
        for member in members:
            member.helper.close()
        scheduler.close()
    failed_commits = sum(m.helper.commit_failures for m in members + gone)
    if failed_commits:  # a member fenced (a broker's failure): its record may be handled again
        run.faults["offset commit refused, member fenced"] += failed_commits
    found = violations(app, run)
    report(run, found, finished=True)
    assert not found, f"seed {seed} ({group_protocol}): {found} ({dict(run.faults)})"
    logging.getLogger(__name__).warning(
        "seed %s (%s): %s steps, faults %s", seed, group_protocol, run.steps, dict(run.faults)
    )
    assert sum(run.faults.values()) > 0


def step_until(
    done: Callable[[], bool], member: Member, scheduler: Scheduler, app: App, what: str, timeout_s: float
) -> None:
    """The scripted tests' loop: poll ``member``, then one ingest batch and one publish round, until
    ``done()``; fails saying ``what`` did not happen after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, (
            f"{what}: not in {timeout_s:.0f} s (handled {dict(app.handled)}, calls {dict(app.calls)})"
        )
        member.helper.poll(0.1)
        scheduler.ingest(kill=False)
        scheduler.publish(kill=False)


class DestinationLater:
    """A member's consumer that delivers the redelivery topic's records before the destination's until
    ``until()``: an order the client may choose (nothing orders two topics' records)."""

    def __init__(self, real: Any, dest: str, until: Callable[[], bool]) -> None:
        self._real, self._dest, self._until = real, dest, until

    def poll(self, timeout: float) -> Any:
        msg = self._real.poll(timeout)
        if msg is not None and msg.error() is None and msg.topic() == self._dest and not self._until():
            self._real.seek(
                TopicPartition(str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))
            )
            return None
        return msg

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_head_handled_with_nothing_parked_releases_what_a_dead_member_parked(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """Found by the model test in CI (seed 11): a member died right after parking a record, before its
    hold recorded the park. Its successor read the head's retry (redelivery topic) before that record
    (destination topic, not committed): nothing was parked as far as it knew, so it finished the chain
    without a release, and handled the record when it read it again. The parked copy stayed held for
    ever. Now every head handled is released: the copy goes out and is skipped as a duplicate."""
    loop, config, holds_topic = new_world(database_url, bootstrap_servers, topic_prefix)
    app = App({(b"k0", 0): 1, (b"k0", 1): 1})
    scheduler = Scheduler(loop)
    first = Member("m0", config, loop, app, holds_topic)
    second: Member | None = None

    def until(done: Callable[[], bool], member: Member, what: str) -> None:
        step_until(done, member, scheduler, app, what, timeout_s=90)

    def pending() -> list[tuple[Any, ...]]:
        with Store(loop.settings.database_url) as store:
            return store.conn.execute(
                "SELECT msg_value, held_by IS NOT NULL FROM retry_jobs WHERE status = 'pending' ORDER BY id"
            ).fetchall()

    try:
        produce(loop.bootstrap, loop.dest, [{"key": b"k0", "value": b"0"}])
        until(lambda: (loop.dest, b"k0") in first.helper.holds, first, "#0 failed, heading a chain")
        first.armed = "sent"  # the next send: #1's park
        produce(loop.bootstrap, loop.dest, [{"key": b"k0", "value": b"1"}])
        with pytest.raises(Crash):
            until(lambda: False, first, "#1 parked")
        first.kill()
        second = Member("m1", config, loop, app, holds_topic)
        second.helper.consumer = DestinationLater(  # type: ignore[assignment]
            second.helper.consumer, loop.dest, lambda: app.handled[b"k0"] == [0]
        )
        until(lambda: app.handled[b"k0"] == [0, 1], second, "#0's retry, then #1 handled")
        until(lambda: not pending(), second, "nothing left held")
        assert second.helper.ordered is not None and second.helper.ordered.counts["duplicates"] >= 1
        assert app.handled[b"k0"] == [0, 1] and app.calls[(b"k0", 1)] == 2
        with Store(loop.settings.database_url) as store:
            parks = store.conn.execute(
                "SELECT status FROM retry_jobs_all WHERE held_by IS NOT NULL AND msg_value = '1'"
            ).fetchall()
        assert parks == [("published",)]  # the dead member's park, released and skipped
    finally:
        for member in (first, second):
            if member is not None:
                with contextlib.suppress(Exception):
                    member.helper.close()
        scheduler.close()


def test_a_chain_released_by_an_operator_goes_on_at_the_helper_whatever_its_head(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """`chains release` on a chain the scheduler knows no head of (its state lost: a 0.4.0 chain, or
    one forgotten) publishes its records with ``retry.chain-state: dead:*``; the helper takes that for
    the death of the head it waits for and goes on (``after_dead``), in order."""
    loop, config, holds_topic = new_world(database_url, bootstrap_servers, topic_prefix)
    app = App({(b"k0", 0): 1})
    scheduler = Scheduler(loop)
    member = Member("m0", config, loop, app, holds_topic)
    where = (loop.dest, b"k0")
    try:
        produce(loop.bootstrap, loop.dest, [{"key": b"k0", "value": b"0"}, {"key": b"k0", "value": b"1"}])
        deadline = time.monotonic() + 60
        while not (where in member.helper.holds and member.helper.holds[where].parked):
            assert time.monotonic() < deadline, "#0 failed and #1 parked: not in 60 s"
            member.helper.poll(0.1)
        chain = member.helper.holds[where].chain
        with Store(loop.settings.database_url) as store:
            while store.conn.execute(
                "SELECT count(*) FROM retry_jobs WHERE held_by = %s", [chain]
            ).fetchone() != (1,):
                assert time.monotonic() < deadline, "#1 held: not in 60 s"
                scheduler.ingest(kill=False)
            store.conn.execute("DELETE FROM retry_released_holds WHERE blocker = %s", [chain])  # state lost
            store.conn.commit()
            assert release_chains(store.queue, [chain], why="test").chains == [chain]
            [head] = store.conn.execute(
                "SELECT status, dead_reason FROM retry_jobs WHERE held_by IS NULL"
            ).fetchall()
        assert head == ("pending", None)  # no head known: none given up (its retry comes back, a copy)
        while app.handled[b"k0"] != [1]:
            assert time.monotonic() < deadline + 60, f"#1 handled: not in time ({dict(app.handled)})"
            scheduler.publish(kill=False)
            member.helper.poll(0.1)
        assert member.helper.ordered is not None and member.helper.ordered.counts["dead_heads"] == 1
        assert where not in member.helper.holds and member.helper.ordered.holds[where].finished
    finally:
        member.helper.close()
        scheduler.close()


def test_a_head_that_dies_with_nothing_parked_frees_its_key_by_the_schedulers_notice(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """A key's only record fails until its retries are exhausted: its head dies at the scheduler with
    nothing parked behind it, so no record of its chain would tell the helper. The scheduler's notice
    (``retry.notice: head-dead`` on the group's redelivery topic, no value) frees the key at once, and
    is never handed to the handler; the key's next record is handled straight away, not parked.
    Before the notice, the key stayed held (in memory and the holds topic) until its next record."""
    loop, config, holds_topic = new_world(database_url, bootstrap_servers, topic_prefix)
    app = App({(b"k0", 0): "always"})
    scheduler = Scheduler(loop)
    member = Member("m0", config, loop, app, holds_topic)
    where = (loop.dest, b"k0")
    redelivery = f"{loop.dest}.{config['group.id']}.redelivery"

    def until(done: Callable[[], bool], what: str) -> None:
        step_until(done, member, scheduler, app, what, timeout_s=60)

    try:
        produce(loop.bootstrap, loop.dest, [{"key": b"k0", "value": b"0"}])
        until(lambda: where in member.helper.holds, "#0 failed, heading a chain")
        hold = member.helper.holds[where]
        chain, head, partition = hold.chain, hold.head, hold.partition
        # The default policy allows 2 retries: #0 handled 3 times, then its head dies.
        until(lambda: where not in member.helper.holds, "the key freed by the notice")
        assert app.calls[(b"k0", 0)] == 3 and app.valueless == 0 and app.handled[b"k0"] == []
        assert member.helper.ordered is not None
        assert member.helper.ordered.counts["dead_heads"] == 1
        assert member.helper.ordered.holds[where].finished
        with Store(loop.settings.database_url) as store:
            rows = store.conn.execute(
                "SELECT status, dead_reason, held_by, msg_value FROM retry_jobs_all ORDER BY id"
            ).fetchall()
        assert ("dead", "exhausted", None, b"0") in rows  # the head, kept dead
        assert ("published", None, chain, None) in rows  # its notice
        notices = [
            s for s in consume(loop.bootstrap, [redelivery], 4, timeout_s=10) if s.header(protocol.NOTICE)
        ]
        assert len(notices) == 1
        notice = notices[0]
        assert (notice.key, notice.value, notice.partition) == (b"k0", None, partition)
        assert notice.header(protocol.NOTICE) == protocol.NOTICE_HEAD_DEAD
        assert notice.header(protocol.HOLD) == chain
        assert notice.header(protocol.CHAIN_STATE) == f"{protocol.CHAIN_DEAD}:{head}"
        assert notice.header(protocol.ORIGINAL_TOPIC) == loop.dest
        # The key's next record is handled at once: no chain to park it in.
        produce(loop.bootstrap, loop.dest, [{"key": b"k0", "value": b"1"}])
        until(lambda: app.handled[b"k0"] == [1], "#1 handled")
        with Store(loop.settings.database_url) as store:
            parked = store.conn.execute(
                "SELECT count(*) FROM retry_jobs_all WHERE msg_value = '1'"
            ).fetchone()
        assert parked == (0,)
    finally:
        member.helper.close()
        scheduler.close()


def test_a_notice_is_never_handed_to_a_handler_outside_ordered_mode(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """A group that left ordered mode while a head was pending still gets that head's notice on its
    redelivery topic: the helper without ordered mode skips it (and commits past it), and a record
    that only looks like one (a value, or another notice word) is the application's, handled."""
    loop, config, _ = new_world(database_url, bootstrap_servers, topic_prefix)
    redelivery = f"{loop.dest}.{config['group.id']}.redelivery"
    seen: list[bytes | None] = []
    helper = RetryingConsumer(config, [loop.dest], lambda msg: seen.append(msg.value()))
    notice = [(protocol.NOTICE, protocol.NOTICE_HEAD_DEAD.encode()), (protocol.HOLD, b"c1"),
              (protocol.CHAIN_STATE, b"dead:r1"), (protocol.ORIGINAL_TOPIC, loop.dest.encode())]  # fmt: skip
    try:
        produce(
            loop.bootstrap, redelivery,
            [{"key": b"k0", "value": None, "headers": notice},
             {"key": b"k0", "value": b"mine", "headers": notice},
             {"key": b"k0", "value": None, "headers": [(protocol.NOTICE, b"something-else")]}],
            partition=0,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while len(seen) < 2:
            assert time.monotonic() < deadline, f"not in 60 s: {seen}"
            helper.poll(0.2)
        committed = helper.consumer.committed([TopicPartition(redelivery, 0)], timeout=10)[0].offset
        assert seen == [b"mine", None] and committed == 3
    finally:
        helper.close()
