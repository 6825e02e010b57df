"""``retry-scheduler demo``: the whole service, end to end, under the real Airflow scheduler.

A simulated application consumes ``demo.orders`` and fails on records in four ways; it hands
failures to the retry topic with the SDK and commits its offsets at once. The ``retry_scheduler``
DAG (unpaused, run by the scheduler) brings them back when due. Malformed records are also sent
straight to the retry topic. The demo waits until every record has its outcome, prints a
summary and stops the stack.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO, cast

from retry_scheduler.client import RetryClient
from retry_scheduler.core import protocol
from retry_scheduler.core.config import Settings

log = logging.getLogger(__name__)

DEMO_TOPIC = "demo.orders"
DAG_ID = "retry_scheduler"


class TransientError(Exception):
    """The simulated dependency is down."""


class SchemaError(Exception):
    """The record can never be processed (declared fatal in the demo policy)."""


@dataclass
class Plan:
    """How many records of each kind, and what the demo expects to see in the end."""

    recover: int
    exhaust: int
    fatal: int
    malformed: int

    @classmethod
    def for_total(cls, total: int) -> Plan:
        total = max(total, 10)
        exhaust, fatal, malformed = total * 3 // 10, total // 10, total // 10
        return cls(total - exhaust - fatal - malformed, exhaust, fatal, malformed)

    @property
    def expected_dead(self) -> dict[str, int]:
        return {
            protocol.DEAD_EXHAUSTED: self.exhaust,
            protocol.DEAD_FATAL: self.fatal,
            protocol.DEAD_INVALID: self.malformed,
        }


@dataclass
class App:
    """The simulated application: fails ``recover-*`` once, ``exhaust-*`` always, ``fatal-*`` fatally."""

    settings: Settings
    run_tag: str
    recovered: set[str] = field(default_factory=set)
    failures: Counter[str] = field(default_factory=Counter)
    stop: threading.Event = field(default_factory=threading.Event)
    #: Set once the group has given the app its partitions of ``demo.orders``.
    ready: threading.Event = field(default_factory=threading.Event)
    #: What ended the app's loop, if anything did: the demo reports it rather than waiting it out.
    error: BaseException | None = None

    def handle(self, key: str, attempt: int) -> None:
        kind = key.split("-", 1)[0]
        if kind == "fatal":
            raise SchemaError(f"order {key} does not match schema v3")
        if kind == "exhaust" or (kind == "recover" and attempt < 1):
            raise TransientError(f"payment service unavailable for {key}")

    def run(self) -> None:
        try:
            self._consume()
        except BaseException as exc:
            self.error = exc
            raise

    def _consume(self) -> None:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.settings.bootstrap_servers,
                "group.id": f"demo-app-{self.run_tag}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 6000,
            }
        )
        retries = RetryClient(
            {"bootstrap.servers": self.settings.bootstrap_servers},
            group="demo-app",
            fatal_errors=(SchemaError,),
        )

        def on_assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            # The group is new: it starts at the earliest record (auto.offset.reset), which the
            # workload is sent after; a later assignment starts where it committed.
            self.ready.set()

        consumer.subscribe([DEMO_TOPIC], on_assign=on_assign)
        try:
            while not self.stop.is_set():
                batch = consumer.consume(200, 0.5)
                for msg in batch:
                    if msg.error():
                        log.warning("demo app: %s", msg.error())
                        continue
                    key = (msg.key() or b"").decode()
                    if not key.endswith(self.run_tag):
                        continue
                    headers = dict(msg.headers() or [])
                    raw_attempt = headers.get(protocol.ATTEMPT) or b"0"
                    attempt = int(raw_attempt.decode() if isinstance(raw_attempt, bytes) else raw_attempt)
                    try:
                        self.handle(key, attempt)
                        self.recovered.add(key)
                    except Exception as exc:
                        self.failures[type(exc).__name__] += 1
                        retries.retry(msg, exc, wait=False)
                if batch:
                    # The failures are safely on the retry topic: the partition moves on.
                    retries.flush()
                    try:
                        consumer.commit(asynchronous=False)
                    except KafkaException as exc:  # nothing to commit yet, or a rebalance
                        log.debug("demo app commit skipped: %s", exc)
        finally:
            consumer.close()


def _malformed(tag: str, count: int) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
    kinds: list[list[tuple[str, bytes]]] = [
        [(protocol.DESTINATION, DEMO_TOPIC.encode()), (protocol.ATTEMPT, b"three")],
        [(protocol.REASON, b"no destination at all")],
        [(protocol.DESTINATION, b"__consumer_offsets")],
        [(protocol.DESTINATION, DEMO_TOPIC.encode()), (protocol.SEND_TO, b"later")],
        [(protocol.DESTINATION, b"demo.\xff\xfe")],
    ]
    return [(f"malformed-{i}-{tag}".encode(), kinds[i % len(kinds)]) for i in range(count)]


def _create_demo_topic(settings: Settings) -> None:
    """Create ``demo.orders`` before the app subscribes: a consumer that subscribed to a topic not
    there yet learns of it only at its next metadata refresh (librdkafka: every 5 minutes)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from retry_scheduler.holds import create_topics
    from retry_scheduler.replication import AUTO

    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    failed = create_topics(admin, [NewTopic(DEMO_TOPIC, 1, AUTO)])
    if failed:
        raise RuntimeError(f"the demo could not create {DEMO_TOPIC}: {failed[DEMO_TOPIC]}")


def _start_app(app: App, timeout_s: float) -> threading.Thread:
    """Start the app's consumer and wait until the group has assigned it ``demo.orders``."""
    thread = threading.Thread(target=app.run, name="demo-app", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not app.ready.wait(0.5):
        if app.error is not None or not thread.is_alive():
            raise RuntimeError(f"the demo app stopped before it was assigned {DEMO_TOPIC}: {app.error!r}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the demo app was not assigned {DEMO_TOPIC} within {timeout_s:.0f} s")
    return thread


def _send_workload(settings: Settings, plan: Plan, tag: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "enable.idempotence": True})
    for kind, count in (("recover", plan.recover), ("exhaust", plan.exhaust), ("fatal", plan.fatal)):
        for i in range(count):
            producer.produce(DEMO_TOPIC, key=f"{kind}-{i}-{tag}".encode(), value=f'{{"order": {i}}}'.encode())
    for key, headers in _malformed(tag, plan.malformed):
        producer.produce(settings.retry_topic, key=key, value=b"{}", headers=cast(Any, headers))
    if producer.flush(30):
        raise RuntimeError("the demo workload was not acknowledged by the broker")


def _outcome(settings: Settings, tag: str) -> dict[str, object]:
    from retry_scheduler.db.connection import connect
    from retry_scheduler.db.readings import Readings
    from retry_scheduler.db.schema import q

    key_like = f"%-{tag}".encode()  # the run's keys: repeated demos share the database
    with connect(settings.database_url) as conn:
        readings = Readings(conn)
        counts, dead = readings.counts(key_like=key_like), readings.dead_by_reason(key_like=key_like)
        on_dlq, lateness = conn.execute(q("demo_outcome"), {"key_like": key_like}).fetchone() or (0, None)
    return {
        "ingested": sum(counts.values()),
        "published": counts.get("published", 0),
        "pending": counts.get("pending", 0),
        "dead": dead,
        "dead_on_dlq": int(on_dlq),
        "lateness": list(lateness or []),
    }


def warm_up(settings: Settings, tag: str, timeout_s: float) -> None:
    """Send one record due now and wait until it is published: the pipeline is then live.

    The first DAG run needs a few seconds to start and join the consumer group; without this
    wait that start-up would be counted as lateness of the workload.
    """
    import psycopg
    from confluent_kafka import Producer

    key = f"warmup.{tag}".encode()
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    headers = [(protocol.DESTINATION, b"demo.warmup"), (protocol.AT, b"0")]
    producer.produce(settings.retry_topic, key=key, value=b"{}", headers=cast(Any, headers))
    producer.flush(30)
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT status::text FROM retry_published_jobs WHERE msg_key = %s", (key,)
            ).fetchone()
            if row:
                return
            time.sleep(1)
    raise RuntimeError(f"the warm-up record was not published within {timeout_s:.0f} s: see .dev/logs")


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


def run_demo(
    settings: Settings,
    records: int = 200,
    timeout_s: float = 600,
    say: Callable[[str], None] = print,
    json_out: TextIO | None = None,
    **stack_options: Any,
) -> int:
    """Run the scenario; returns the exit code (0 when every record reached its expected outcome).

    ``json_out``: where the summary also goes, as one JSON object (``demo --json``: stdout, the
    narrative then going to stderr). ``stack_options`` go to :class:`DevStack` (ports, metadata
    database, AIRFLOW_HOME).
    """
    from retry_scheduler.dev.airflow_api import api_token, trigger_dag, unpause_dag
    from retry_scheduler.dev.stack import DevStack

    settings = settings.with_overrides(create_topics=True)
    plan = Plan.for_total(records)
    tag = uuid.uuid4().hex[:6]
    with DevStack(settings, say=say, **stack_options) as stack:
        token = api_token(stack.base_url)
        unpause_dag(stack.base_url, token, DAG_ID)
        trigger_dag(stack.base_url, token, DAG_ID)
        say(f"DAG {DAG_ID} unpaused and triggered; the scheduler starts a run every minute")
        began = time.monotonic()
        warm_up(settings, tag, min(timeout_s, 300))
        say(
            f"the retry_scheduler DAG is live (a warm-up record went through in {time.monotonic() - began:.0f} s)"
        )

        _create_demo_topic(settings)
        app = App(settings, tag)
        thread = _start_app(app, min(timeout_s, 120))
        _send_workload(settings, plan, tag)
        say(
            f"sent {plan.recover} recovering, {plan.exhaust} exhausting, {plan.fatal} fatal records "
            f"to {DEMO_TOPIC} and {plan.malformed} malformed ones to {settings.retry_topic}"
        )
        started = time.monotonic()
        outcome = _outcome(settings, tag)
        done, next_note = False, started
        while time.monotonic() - started < timeout_s:
            outcome = _outcome(settings, tag)
            done = (
                len(app.recovered) == plan.recover
                and outcome["dead"] == plan.expected_dead
                and outcome["dead_on_dlq"] == sum(plan.expected_dead.values())
            )
            if done:
                break
            if app.error is not None:
                say(f"the demo app stopped: {app.error!r}")
                break
            if time.monotonic() >= next_note:  # progress every 5 s; the outcome is checked every second
                next_note += 5
                say(
                    f"  {time.monotonic() - started:5.0f}s  recovered {len(app.recovered)}/{plan.recover}, "
                    f"ingested {outcome['ingested']}, published {outcome['published']}, dead {outcome['dead']}"
                )
            time.sleep(1)
        app.stop.set()
        thread.join(15)

    return _summarize(plan, outcome, len(app.recovered), done, say, json_out)


def _summarize(
    plan: Plan,
    outcome: dict[str, object],
    recovered: int,
    done: bool,
    say: Callable[[str], None],
    json_out: TextIO | None,
) -> int:
    """Say what became of the workload (and write it as JSON to ``json_out``); the demo's exit code."""
    late = outcome["lateness"]
    assert isinstance(late, list)
    p50, p99 = _pct(late, 0.5), _pct(late, 0.99)
    early = sum(1 for v in late if v < 0)
    say("")
    say("demo summary")
    say(f"  {'ingested into retry_jobs':<28}{outcome['ingested']:>8}")
    say(f"  {'published to ' + DEMO_TOPIC:<28}{outcome['published']:>8}")
    say(f"  {'recovered by the app':<28}{recovered:>8}   (expected {plan.recover})")
    for reason, expected in plan.expected_dead.items():
        got = outcome["dead"].get(reason, 0) if isinstance(outcome["dead"], dict) else 0
        say(f"  {'dead: ' + reason:<28}{got:>8}   (expected {expected})")
    say(f"  {'dead records on retry.dlq':<28}{outcome['dead_on_dlq']:>8}")
    fmt = lambda v: "-" if v is None else f"{v:.3f}s"  # noqa: E731
    say(f"  {'lateness p50 / p99':<28}{fmt(p50):>8} / {fmt(p99)}   early: {early}")
    say(
        "  result: " + ("OK, every record reached its expected outcome" if done else "INCOMPLETE (timed out)")
    )
    ok = done and early == 0
    if json_out is not None:
        summary = {
            "ok": ok,
            "complete": done,
            "ingested": outcome["ingested"],
            "published": outcome["published"],
            "recovered": recovered,
            "dead": outcome["dead"],
            "dead_on_dlq": outcome["dead_on_dlq"],
            "expected": {"recovered": plan.recover, "dead": plan.expected_dead},
            "lateness_s": {"p50": p50, "p99": p99, "max": late[-1] if late else None},
            "early": early,
        }
        print(json.dumps(summary, sort_keys=True), file=json_out, flush=True)
    return 0 if ok else 1
