"""One trial: a workload, one fault at a random point, recovery, and the count of every record."""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos.breaker import BREAKER_ENV, BREAKER_FAULTS, closer, hold, plan_breaker_fault
from bench.chaos.cluster import CLUSTER_FAULTS, cluster_striker, plan_cluster_fault
from bench.chaos.common import (
    FATAL_ERROR,
    FAULTS,
    INGEST_BATCH,
    INGEST_WORKERS,
    MAX_ATTEMPTS,
    PUBLISH_BATCH,
    Header,
    reached,
)
from bench.chaos.failover import FAILOVER_FAULTS, failover_striker, plan_failover_fault
from bench.chaos.stack import ChaosStack, Supervisor, Worker, worker_env
from bench.chaos.topics import Seen, Topics, create_topics, delete_topics, read_topics, send, wait_done
from retry_scheduler.core import protocol as p

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Expected:
    """What should become of one workload record."""

    uid: str
    outcome: str  # "published", or the dead reason on the DLQ
    attempt: int
    retry_id: str | None
    due_ms: int | None  # an explicit retry.at
    delay_ms: int | None  # else the default policy's delay, from the record's timestamp
    partition: int | None  # retry.original-partition, on the destination topic
    trace: bytes
    key: bytes
    value: bytes


def workload(
    rng: random.Random, n: int, topics: Topics, now_ms: int, *, dead_only: bool = False
) -> tuple[list[dict[str, Any]], list[Expected]]:
    """``n`` records for the retry topic: due now, due soon, policy-timed, exhausted, fatal, sent to the DLQ.

    ``dead_only``: only the last three kinds, every record ends dead (for the DLQ and bulk replays).
    """
    records: list[dict[str, Any]] = []
    expected: list[Expected] = []
    for i in range(n):
        uid = f"r{i:05d}"
        roll = 0.80 + rng.random() * 0.20 if dead_only else rng.random()
        attempt = rng.randrange(MAX_ATTEMPTS)
        retry_id = str(uuid.UUID(int=rng.getrandbits(128))) if rng.random() < 0.5 else None
        trace = rng.randbytes(rng.randrange(0, 24))
        partition = i % 3 if rng.random() < 0.3 else None
        if partition is not None:
            headers: list[Header] = [
                (p.ORIGINAL_TOPIC, topics.dest.encode()),
                (p.ORIGINAL_PARTITION, str(partition).encode()),
            ]
        else:
            headers = [(p.DESTINATION, topics.dest.encode())]
        headers.append(("trace", trace))
        outcome, due_ms, delay_ms = "published", None, None
        if roll < 0.40:
            due_ms = now_ms + rng.randint(-2000, 500)
        elif roll < 0.65:
            due_ms = now_ms + rng.randint(500, 4000)
        elif roll < 0.73:
            delay_ms = 1000 if attempt == 0 else 2000  # the default policy: delays 1s, 2s
        elif roll < 0.80:
            headers.append((p.POLICY, b"chaos-backoff"))
        elif roll < 0.88:
            attempt, outcome = MAX_ATTEMPTS + rng.randrange(3), p.DEAD_EXHAUSTED
        elif roll < 0.94:
            headers.append((p.ERROR_CLASS, f"app.errors.{FATAL_ERROR}".encode()))
            outcome = p.DEAD_FATAL
        else:
            headers.append((p.SEND_TO, b"dlq"))
            outcome = p.DEAD_REQUESTED
        if due_ms is not None:
            headers.append((p.AT, str(due_ms).encode()))
        headers.append((p.ATTEMPT, str(attempt).encode()))
        if retry_id:
            headers.append((p.ID, retry_id.encode()))
        headers.append((p.REASON, f"chaos {uid} failed".encode()))
        key, value = f"k{i}".encode(), uid.encode() + b"|" + rng.randbytes(rng.randrange(0, 200))
        records.append({"key": key, "value": value, "headers": headers})
        expected.append(
            Expected(uid, outcome, attempt, retry_id, due_ms, delay_ms, partition, trace, key, value)
        )
    return records, expected


def _uid(seen: Seen) -> str:
    return (seen.value or b"").split(b"|", 1)[0].decode(errors="replace")


@dataclass
class Tally:
    """The count of one trial (or of a whole run, summed)."""

    records: int = 0
    lost: int = 0
    duplicates: int = 0
    duplicates_unidentified: int = 0
    misrouted: int = 0
    wrong_headers: int = 0
    early: int = 0
    source_duplicates: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicates_unidentified or self.wrong_headers or self.early)

    def note(self, text: str) -> None:
        if len(self.examples) < 5:
            self.examples.append(text)

    def add(self, other: Tally) -> None:
        for name in ("records", "lost", "duplicates", "duplicates_unidentified", "misrouted",
                     "wrong_headers", "early", "source_duplicates"):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for text in other.examples:
            self.note(text)


def account(
    expected: Sequence[Expected], source: Sequence[Seen], dest: Sequence[Seen], dlq: Sequence[Seen]
) -> Tally:
    """Compare what was sent with what reached the destination and the DLQ."""
    tally = Tally(records=len(expected))
    sent_at = {_uid(s): s.timestamp_ms for s in source}
    tally.source_duplicates = len(source) - len(sent_at)
    by_topic: dict[str, dict[str, list[Seen]]] = {"published": defaultdict(list), "dlq": defaultdict(list)}
    for seen in dest:
        by_topic["published"][_uid(seen)].append(seen)
    for seen in dlq:
        by_topic["dlq"][_uid(seen)].append(seen)
    for copies_by_uid in by_topic.values():
        for uid, copies in copies_by_uid.items():
            if len(copies) < 2:
                continue
            tally.duplicates += len(copies) - 1
            twin = (copies[0].header(p.ID), copies[0].header(p.ATTEMPT))
            if None in twin or any((c.header(p.ID), c.header(p.ATTEMPT)) != twin for c in copies[1:]):
                tally.duplicates_unidentified += len(copies) - 1
                tally.note(f"{uid}: copies differ in retry.id/retry.attempt")
    for exp in expected:
        where = "published" if exp.outcome == "published" else "dlq"
        copies = by_topic[where].get(exp.uid, [])
        elsewhere = by_topic["dlq" if where == "published" else "published"].get(exp.uid)
        if not copies:
            tally.lost += 1
            tally.misrouted += bool(elsewhere)
            tally.note(
                f"{exp.uid}: expected {exp.outcome}, "
                + ("found on the other topic" if elsewhere else "found nowhere")
            )
            continue
        for copy in copies:
            problem = _check_copy(exp, copy, sent_at.get(exp.uid))
            if problem == "early":
                tally.early += 1
            elif problem:
                tally.wrong_headers += 1
            if problem:
                tally.note(f"{exp.uid}: {problem}")
    return tally


def _check_copy(exp: Expected, copy: Seen, sent_ms: int | None) -> str | None:
    if (copy.key, copy.value) != (exp.key, exp.value):
        return "key or value changed"
    trace = [v for k, v in copy.headers if k == "trace"]
    if trace != [exp.trace]:
        return f"pass-through header changed: {trace!r}"
    if exp.retry_id and copy.header(p.ID) != exp.retry_id:
        return f"retry.id {copy.header(p.ID)!r}, sent {exp.retry_id!r}"
    if exp.outcome != "published":
        reason = copy.header(p.DEAD_REASON)
        return None if reason == exp.outcome else f"dead reason {reason!r}, expected {exp.outcome!r}"
    if copy.header(p.ATTEMPT) != str(exp.attempt + 1):
        return f"retry.attempt {copy.header(p.ATTEMPT)!r}, expected {exp.attempt + 1}"
    if exp.partition is not None and copy.partition != exp.partition:
        return f"published to partition {copy.partition}, expected {exp.partition}"
    due_ms = exp.due_ms
    if due_ms is None and exp.delay_ms is not None and sent_ms is not None:
        due_ms = sent_ms + exp.delay_ms
    if due_ms is not None and copy.timestamp_ms < due_ms:
        return "early"
    return None


@dataclass
class TrialResult:
    trial: int
    fault: str
    detail: dict[str, Any]
    fired: bool
    recovered: bool
    seconds: float
    starts: dict[str, int]
    tally: Tally

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(out.pop("tally"))
        out["ok"] = self.recovered and self.tally.ok
        return out


def plan_fault(fault: str, rng: random.Random, records: int) -> tuple[dict[str, Any], dict[str, str]]:
    """Where this trial's fault strikes: the parameters (for the report) and the workers' fault plans.

    Kills inside the loops go by checkpoint count; the broker and PostgreSQL are hit once a random
    number of jobs were stored (``after: stored``) or published (``after: published``).
    """
    if fault in BREAKER_FAULTS:
        return plan_breaker_fault(fault, rng, records)
    if fault in CLUSTER_FAULTS:
        return plan_cluster_fault(fault, rng, records), {}
    if fault in FAILOVER_FAULTS:
        return plan_failover_fault(fault, rng, records), {}
    published = int(records * 0.78)  # 80 % of the workload goes back to its destination, 20 % dies
    if fault in ("kill_ingest_consumed", "kill_ingest_stored"):
        # A batch holds at most INGEST_BATCH records, so there are at least this many batches, shared by
        # the ingest loop's worker processes (each counts its own checkpoints).
        n = rng.randint(1, max(1, records // INGEST_BATCH // INGEST_WORKERS))
        checkpoint = "ingest.consumed" if fault.endswith("consumed") else "ingest.stored"
        return {"checkpoint": checkpoint, "n": n}, {"ingest": f"{checkpoint}:{n}"}
    if fault == "kill_publish_produced":
        n = rng.randint(1, max(1, published // PUBLISH_BATCH))
        return {"checkpoint": "publish.produced", "n": n}, {"publish": f"publish.produced:{n}"}
    if fault == "kill_publish_dlq_produced":
        n = rng.randint(1, max(1, (records - published) // PUBLISH_BATCH))
        return {"checkpoint": "publish.dlq_produced", "n": n}, {"publish": f"publish.dlq_produced:{n}"}
    if fault == "kill_anytime":
        return {"worker": rng.choice(["ingest", "publish"]), "at_s": round(rng.uniform(0.5, 4.0), 3)}, {}
    if fault == "broker_pause":
        return {
            "after": "published",
            "count": rng.randint(1, published * 2 // 3),
            "pause_s": round(rng.uniform(1, 8), 3),
        }, {}
    if fault == "postgres_restart_ingest":
        after: dict[str, Any] = {"after": "stored", "count": rng.randint(1, records * 4 // 5)}
    elif fault == "postgres_restart_publish":
        after = {"after": "published", "count": rng.randint(1, published * 2 // 3)}
    else:
        raise ValueError(f"unknown fault {fault!r} (known: {', '.join(FAULTS)})")
    return {**after, "down_s": round(rng.uniform(0, 2), 3), "mode": rng.choice(["fast", "immediate"])}, {}


def _striker(
    stack: ChaosStack, fault: str, detail: dict[str, Any], workers: dict[str, Worker], database_url: str
) -> Callable[[], None]:
    """The body of the thread that injects a fault from outside the workers; notes when it struck."""

    def strike() -> None:
        began = time.monotonic()
        if "after" in detail:
            detail["triggered"] = reached(database_url, detail["after"], detail["count"], 60)
        else:
            time.sleep(detail["at_s"])
        detail["struck_at_s"] = round(time.monotonic() - began, 3)
        if fault == "kill_anytime":
            workers[detail["worker"]].kill()
        elif fault == "broker_pause":
            stack.pause_broker(detail["pause_s"])
        else:
            stack.restart_postgres(detail["down_s"], detail["mode"])

    return strike


@dataclass(frozen=True)
class TrialGround:
    """A trial's own topics, database and log directory (for the workers' logs)."""

    topics: Topics
    dbname: str
    database_url: str
    logs: Path

    @classmethod
    def prepare(cls, stack: ChaosStack, index: int) -> TrialGround:
        topics, dbname = Topics(f"c{index:03d}"), f"chaos_{index:03d}"
        database_url = stack.create_database(dbname)
        create_topics(stack.bootstrap, topics.all)
        logs = stack.work_dir / "logs"
        logs.mkdir(exist_ok=True)
        return cls(topics, dbname, database_url, logs)

    def clear(self, stack: ChaosStack) -> None:
        """Drop the database and the topics: only after a trial that passed (kept for a look otherwise)."""
        stack.drop_database(self.dbname)
        delete_topics(stack.bootstrap, self.topics.all)


def run_trial(
    stack: ChaosStack, index: int, fault: str, rng: random.Random, records: int, timeout_s: float = 120
) -> TrialResult:
    """One trial on a fresh database and fresh topics; returns its count."""
    began = time.monotonic()
    ground = TrialGround.prepare(stack, index)
    topics, database_url, logs = ground.topics, ground.database_url, ground.logs
    detail, plans = plan_fault(fault, rng, records)
    breaker = fault in BREAKER_FAULTS
    env = worker_env(stack, database_url, topics, **(BREAKER_ENV if breaker else {}))
    if breaker:
        hold(database_url, topics.dest)
    workers = {
        kind: Worker(kind, env, logs / f"trial-{index:03d}-{kind}.log", plans.get(kind))
        for kind in ("ingest", "publish")
    }
    batch, expected = workload(rng, records, topics, int(time.time() * 1000))
    striker: threading.Thread | None = None
    with Supervisor(list(workers.values())):
        if not plans or breaker:
            if breaker:
                strike = closer(detail, workers, database_url, topics.dest)
            elif fault in CLUSTER_FAULTS:
                assert stack.cluster is not None, f"{fault} is a fault of a cluster: run chaos --cluster"
                strike = cluster_striker(stack.cluster, fault, detail, database_url, topics)
            elif fault in FAILOVER_FAULTS:
                assert stack.pair is not None, (
                    f"{fault} is a fault of a replicated PostgreSQL: run chaos --postgres-failover"
                )
                strike = failover_striker(stack.pair, fault, detail, database_url, stack.bootstrap, topics)
            else:
                strike = _striker(stack, fault, detail, workers, database_url)
            striker = threading.Thread(target=strike, name="chaos-fault")
            striker.start()
        send(stack.bootstrap, topics.retry, batch, chunks=8, gap_s=0.15)
        if striker is not None:
            striker.join()
        recovered = wait_done(database_url, records, timeout_s)
    if fault.startswith("kill_"):
        target = detail.get("worker") or ("ingest" if "ingest" in fault else "publish")
        fired = workers[target].fault_fired
    else:
        fired = bool(detail.get("triggered", True))
    seen = read_topics(stack.bootstrap, topics.all)
    tally = account(expected, seen[topics.retry], seen[topics.dest], seen[topics.dlq])
    if recovered and tally.ok:
        ground.clear(stack)
    return TrialResult(
        index, fault, detail, fired, recovered, round(time.monotonic() - began, 2),
        {kind: w.starts for kind, w in workers.items()}, tally,
    )  # fmt: skip
