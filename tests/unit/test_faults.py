"""The fault-injection seam: the plan's syntax, a real SIGKILL at the N-th checkpoint, and where the loops call it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from retry_scheduler.core import faults
from retry_scheduler.core import protocol as p
from retry_scheduler.core.config import Settings
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.jobs import OutgoingRow
from retry_scheduler.core.policy import PolicyRegistry
from retry_scheduler.loops.ingest import Ingestor
from retry_scheduler.loops.publish import Publisher

PLUGINS = str(Path(__file__).resolve().parents[2] / "plugins")


def test_plan_names_checkpoints_and_counts() -> None:
    assert faults.parse("") == {}
    assert faults.parse("ingest.stored:3, publish.produced:1") == {"ingest.stored": 3, "publish.produced": 1}


@pytest.mark.parametrize(
    ("spec", "fault"),
    [
        ("ingest.stored", "must look like CHECKPOINT:N"),
        ("ingest.stored:0", "must look like CHECKPOINT:N with N >= 1"),
        ("ingest.stored:x", "must look like CHECKPOINT:N"),
        ("ingest.stord:2", "unknown checkpoint 'ingest.stord'"),
    ],
)
def test_malformed_plan_is_refused_with_its_fault(spec: str, fault: str) -> None:
    with pytest.raises(faults.FaultSpecError) as err:
        faults.parse(spec)
    assert fault in str(err.value)


def _run(code: str, fault: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != faults.ENV}
    env["PYTHONPATH"] = PLUGINS
    if fault is not None:
        env[faults.ENV] = fault
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


REACH = """
from retry_scheduler.core import faults
for i in range(5):
    faults.checkpoint("ingest.consumed")
    faults.checkpoint("ingest.stored")
    print(i, flush=True)
"""


def test_process_kills_itself_the_nth_time_the_checkpoint_is_reached() -> None:
    done = _run(REACH, "ingest.stored:3")
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["0", "1"]  # the third time, before it could print 2


def test_without_a_plan_checkpoints_do_nothing() -> None:
    done = _run(REACH, None)
    assert done.returncode == 0
    assert done.stdout.split() == ["0", "1", "2", "3", "4"]


JOB = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
from retry_scheduler.core import faults
faults.checkpoint("dlq.batch")
print("survived", flush=True)
"""


def test_a_job_checkpoint_kills_every_process_of_the_job() -> None:
    """A bulk operation dies whole (its children too), as when the machine running it is lost."""
    env = {k: v for k, v in os.environ.items() if k != faults.ENV}
    env.update(PYTHONPATH=PLUGINS, **{faults.ENV: "dlq.batch:1"})
    done = subprocess.run(
        [sys.executable, "-c", JOB],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert done.returncode == -signal.SIGKILL
    child = int(done.stdout.split()[0])
    assert "survived" not in done.stdout
    for _ in range(100):  # the child is killed too, not left to finish its minute
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child, os.WNOHANG)
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the job's child process outlived the job")


def test_a_malformed_plan_fails_at_import_naming_the_variable() -> None:
    done = _run("import retry_scheduler.core.faults", "publish.produced")
    assert done.returncode == 1
    assert "RETRY_FAULT entry 'publish.produced' must look like CHECKPOINT:N" in done.stderr


# Where the loops call the seam: checkpoints recorded next to the calls on the loops' boundaries.


class FakeMessage:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "retry"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_800_000_000_000)

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"

    def headers(self) -> list[tuple[str, bytes]]:
        return [(p.DESTINATION, b"orders")]


class Recorder:
    """Stands in for the consumer, the producer and the store: records the calls that matter, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self._pending: list[Any] = []
        self.claimed_up_to = None  # the store's: when its last claim began

    # consumer
    def consume(self, n: int, timeout: float) -> list[FakeMessage]:
        return [FakeMessage(0), FakeMessage(1)]

    def commit(self, offsets: Any, asynchronous: bool) -> None:
        self.events.append("offsets committed")

    def committed(self, partitions: Any, timeout: float) -> list[Any]:
        return partitions

    def list_topics(self, timeout: float) -> Any:
        return type("Meta", (), {"topics": {}})()

    # store, and its parts
    @property
    def conn(self) -> Recorder:
        return self

    queue = breakers = slots = loops = readings = conn

    def listen_overdue(self) -> Recorder:  # the store's notices of overdue jobs: none here
        return self

    def database_identity(self) -> str:  # the mark of the ingest's offset commits
        return "0f1e2d3c-0000-4000-8000-000000000001"

    def take(self) -> None:
        return None

    def peek(self) -> None:
        return None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        self.events.append("transaction begins")
        yield
        self.events.append("transaction commits")

    def limit_idle_transactions(self, timeout_ms: int) -> None:
        pass

    def insert_rows(self, rows: list[Any], **offsets: Any) -> list[str | None]:
        self.events.append("rows committed")
        return [None] * len(rows)

    def ingest_offsets(self, group: str) -> dict[Any, int]:
        return {}

    def claim_dead(self, *args: Any) -> list[OutgoingRow]:
        return [_row(1, dead=True)]

    def claim_due(self, *args: Any, **kwargs: Any) -> list[OutgoingRow]:
        return [_row(2, dead=False)]

    def mark_published(self, acked: list[Any]) -> int:
        self.events.append("marked published")
        return len(acked)

    def mark_dlq_published(self, acked: list[Any]) -> int:
        self.events.append("marked DLQ-published")
        return len(acked)

    def mark_failed(self, failed: list[Any]) -> list[Any]:
        raise AssertionError(f"nothing should fail: {failed}")

    # producer
    def produce(self, topic: str, on_delivery: Any, **kwargs: Any) -> None:
        self._pending.append(on_delivery)

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        for callback in self._pending:
            callback(None, None)
        self.events.append("acknowledged")
        self._pending.clear()
        return 0

    # topics
    def ensure(self, topics: Any, create: bool) -> list[str]:
        return []


def _row(job_id: int, dead: bool) -> OutgoingRow:
    return OutgoingRow(
        id=job_id, destination="orders", destination_partition=None, key=b"k", value=b"v", headers=None,
        attempt=0, policy="default", reason=None, error_class=None, consumer_group=None, retry_id="rid",
        original_topic="orders", original_partition=None, original_offset=None,
        original_timestamp_ms=1_800_000_000_000, dead_reason="exhausted" if dead else None, dlq_topic="retry.dlq",
    )  # fmt: skip


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    monkeypatch.setattr(faults, "checkpoint", lambda name: rec.events.append(f"checkpoint {name}"))
    return rec


def test_ingest_checkpoints_sit_between_consume_row_commit_and_offset_commit(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    class FreeLock:
        def __init__(self, *args: Any) -> None:
            pass

        def acquire(self, *args: Any) -> bool:
            return True

    monkeypatch.setattr("retry_scheduler.loops.ingest.IngestLock", FreeLock)
    registry = PolicyRegistry.of([])
    ingestor = Ingestor(Deployment(Settings(), registry), recorder, consumer=recorder)  # type: ignore[arg-type]
    assert ingestor.ingest_batch().stored == 2
    assert recorder.events == [
        "checkpoint ingest.consumed",
        "rows committed",
        "checkpoint ingest.stored",
        "offsets committed",
    ]


def test_publish_checkpoints_sit_between_the_ack_and_the_mark(recorder: Recorder) -> None:
    publisher = Publisher(
        Deployment(Settings(destination_allowlist="^orders$"), PolicyRegistry.of([])),
        recorder,  # type: ignore[arg-type]
        producer=recorder,  # type: ignore[arg-type]
        topics=recorder,  # type: ignore[arg-type]
    )
    counts = publisher.publish_once()
    assert (counts.published, counts.dead_published) == (1, 1)
    assert recorder.events == [
        "acknowledged",
        "checkpoint publish.dlq_produced",
        "marked DLQ-published",
        "transaction begins",
        "acknowledged",
        "checkpoint publish.produced",
        "marked published",
        "transaction commits",
    ]
