"""What the dev stack tells operators, under its real scheduler: the loops' metrics through Airflow's
StatsD layer, a Deadline Alert of a late bulk replay through the webhook channel, and dead letters
starting the example DAG through an asset watcher.

The module's tests share one dev stack (a stack's start is most of each test's cost); its DAGs folder
holds the project's DAGs, ``retry_bulk_replay`` with a 2-second deadline, and the example DAG
``examples/dags/on_dead_letters.py``. Each test uses DAGs, topics and records of its own, and reads
only what concerns them: StatsD counters as differences, the webhook's alerts of its own DAG, the
DAG runs that started after it did.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from confluent_kafka import Producer

from retry_scheduler.core import protocol
from retry_scheduler.core.metrics import METRICS
from retry_scheduler.dev.airflow_api import (
    api_token,
    dag_runs,
    set_paused,
    trigger_dag,
    unpause_dag,
    wait_for_dag_run,
)
from retry_scheduler.dev.demo import warm_up
from retry_scheduler.dev.stack import DevStack
from tests.airflow_rest import xcom_value
from tests.conftest import ROOT
from tests.e2e.stacks import new_dev_stack, reparse
from tests.integration.test_monitor import WebhookReceiver
from tests.kafkautil import consume, create_topics

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

#: The topic the example DAG's asset watches (``RETRY_DLQ_WATCH_TOPICS``): not the service's own DLQ
#: topic, which the loops of the metrics test write their dead letters to.
WATCHED = "retry.dlq.watched"

THIN_BULK_REPLAY = """
from datetime import timedelta

from retry_scheduler.airflow.dags.retry_bulk_replay import retry_bulk_replay_dag

# a deadline no Spark job meets: its JVM alone takes longer to start
dag = retry_bulk_replay_dag(deadline=timedelta(seconds=2))
"""


class StatsdReceiver:
    """Every StatsD line sent to 127.0.0.1:``port``: name -> [(value, kind)]."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.seen: dict[str, list[tuple[float, str]]] = defaultdict(list)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            for line in data.decode(errors="replace").splitlines():  # name:value|kind[|@rate]
                name, _, rest = line.partition(":")
                value, _, kind = rest.partition("|")
                with contextlib.suppress(ValueError):
                    self.seen[name].append((float(value), kind.split("|")[0]))

    def total(self, name: str) -> float:
        return sum(value for value, kind in self.seen.get(name, []) if kind == "c")

    def settled(self, quiet_s: float = 5.0) -> dict[str, float]:
        """The counters' totals once none has moved for ``quiet_s``."""
        totals: dict[str, float] = {}
        while True:
            now = {name: self.total(f"airflow.{name}") for name in METRICS}
            if now == totals:
                return now
            totals = now
            time.sleep(quiet_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def dead_letter(retry_id: str, destination: str, reason: str | bytes) -> dict[str, Any]:
    """A record as the publish loop writes it to the DLQ topic (its headers; the value as it was)."""
    headers = [
        (protocol.ID, retry_id.encode()),
        (protocol.DESTINATION, destination.encode()),
        (protocol.DEAD_REASON, b"exhausted"),
        (protocol.REASON, reason if isinstance(reason, bytes) else reason.encode()),
        (protocol.ERROR_CLASS, b"TimeoutError"),
        (protocol.ATTEMPT, b"4"),
    ]
    return {"key": retry_id.encode(), "value": b'{"order": 1}', "headers": headers}


@dataclass
class Signals:
    stack: DevStack
    statsd: StatsdReceiver
    webhook: WebhookReceiver


@pytest.fixture(scope="module")
def signals(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Signals]:
    """The module's dev stack, with StatsD and the webhook channel pointed at receivers of the module."""
    home = tmp_path_factory.mktemp("signals")
    dags = home / "dags"
    dags.mkdir()
    for dag_file in (ROOT / "dags").glob("*.py"):
        shutil.copy(dag_file, dags)
    (dags / "retry_bulk_replay.py").write_text(THIN_BULK_REPLAY)
    shutil.copy(ROOT / "examples" / "dags" / "on_dead_letters.py", dags)
    statsd, webhook = StatsdReceiver(), WebhookReceiver()
    try:
        with pytest.MonkeyPatch.context() as patch:
            for key, value in {"STATSD_ON": "True", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(statsd.port),
                               "STATSD_PREFIX": "airflow"}.items():  # fmt: skip
                patch.setenv(f"AIRFLOW__METRICS__{key}", value)
            patch.setenv("AIRFLOW_CONN_RETRY_ALERT_WEBHOOK", webhook.url)
            patch.setenv("RETRY_DLQ_WATCH_TOPICS", WATCHED)
            with new_dev_stack(
                module_database_url, home, "retry_airflow_signals_", dags_folder=dags
            ) as stack:
                yield Signals(stack, statsd, webhook)
    finally:
        statsd.close()
        webhook.close()


def test_the_loops_report_counts_backlog_and_lateness_through_airflow_statsd(signals: Signals) -> None:
    stack, receiver = signals.stack, signals.statsd
    settings = stack.settings
    destination = f"demo.metrics-{uuid.uuid4().hex[:8]}"  # dags/retry_policies.py allows demo.*
    try:
        create_topics(settings.bootstrap_servers, [destination])
        token = api_token(stack.base_url)
        unpause_dag(stack.base_url, token, "retry_scheduler")
        trigger_dag(stack.base_url, token, "retry_scheduler")
        warm_up(settings, uuid.uuid4().hex[:6], 300)
        before = receiver.settled()  # the warm-up's counters have all arrived

        producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
        due_ms = int(time.time() * 1000) + 2_000
        for index in range(40):
            headers = [(protocol.DESTINATION, destination.encode()), (protocol.AT, str(due_ms).encode())]
            producer.produce(settings.retry_topic, key=f"m-{index}".encode(), value=b"{}",
                             headers=cast(Any, headers))  # fmt: skip
        for index in range(3):  # no destination: dead at ingest, invalid
            producer.produce(settings.retry_topic, key=f"bad-{index}".encode(), value=b"{}")
        assert producer.flush(30) == 0
        assert len(consume(settings.bootstrap_servers, [destination], 40, timeout_s=120)) == 40
        deadline = time.monotonic() + 60  # the counters of the last rounds, and a snapshot after them
        while time.monotonic() < deadline:
            delta = {name: receiver.total(f"airflow.{name}") - before[name] for name in METRICS}
            snapshot = receiver.seen.get("airflow.retry_scheduler.publish.lateness_p99", [])
            if delta["retry_scheduler.publish.published"] >= 40 and delta["retry_scheduler.ingest.invalid"] >= 3 \
                    and len(snapshot) >= 2:  # fmt: skip
                break
            time.sleep(1)
    finally:
        # No further runs: the one running ends after its loops' time (the stack stops it at the end).
        set_paused(stack.base_url, api_token(stack.base_url), "retry_scheduler", True)

    assert delta["retry_scheduler.ingest.stored"] == 43
    # (a record read again by the next run's loop at a handover is counted read, and a duplicate)
    assert delta["retry_scheduler.ingest.records"] == 43 + delta["retry_scheduler.ingest.duplicates"]
    assert delta["retry_scheduler.ingest.invalid"] == 3 and delta["retry_scheduler.ingest.dead"] == 3
    assert delta["retry_scheduler.publish.published"] == 40
    assert delta["retry_scheduler.publish.dead_published"] == 3  # the invalid ones, to the DLQ topic
    assert delta["retry_scheduler.publish.delivery_failures"] == 0
    seen = receiver.seen
    assert {kind for _, kind in seen["airflow.retry_scheduler.ingest.batch_size"]} == {"g"}
    assert {kind for _, kind in seen["airflow.retry_scheduler.publish.backlog_due"]} == {"g"}
    assert {kind for _, kind in seen["airflow.retry_scheduler.publish.oldest_overdue_s"]} == {"g"}
    for name in (
        "waiting",
        "stuck",
        "oldest_stuck_s",
    ):  # ordered mode's gauges, every minute: nothing waits here
        gauges = seen[f"airflow.retry_scheduler.chains.{name}"]
        assert {kind for _, kind in gauges} == {"g"} and {value for value, _ in gauges} == {0.0}, (
            name,
            gauges,
        )
    lateness = seen["airflow.retry_scheduler.publish.lateness_p99"]
    assert {kind for _, kind in lateness} == {"ms"} and all(value >= 0 for value, _ in lateness), lateness
    # Airflow's own task metrics come through the same backend: the metrics layer is Airflow's.
    assert any(name.startswith("airflow.ti.") or name.startswith("airflow.task.") for name in seen)


def test_dead_letters_start_the_example_dag_with_each_letter(signals: Signals) -> None:
    stack = signals.stack
    ids = [f"dl-{uuid.uuid4().hex[:6]}-{n}" for n in range(2)]
    started = datetime.now(UTC)
    bootstrap = stack.settings.bootstrap_servers
    create_topics(bootstrap, [WATCHED])
    token = api_token(stack.base_url)
    unpause_dag(stack.base_url, token, "on_dead_letters")
    # Airflow registers an asset's watcher when it parses the DAG unpaused: as it would on its own
    # within the parse interval (30 s in a dev stack, 10 min in the tests' stacks).
    reparse(stack, "on_dead_letters.py")
    producer = Producer({"bootstrap.servers": bootstrap})
    # hostile: a reason of invalid UTF-8 and 100 000 bytes, the retry id given twice
    hostile = dead_letter(ids[1], "orders", b"\xff\xfe" + b"x" * 100_000)
    hostile["headers"].append((protocol.ID, b"second-id-ignored"))
    tombstone: dict[str, Any] = {"key": b"gone", "value": None, "headers": []}  # not a dead letter
    letters = [dead_letter(ids[0], "payments", "card service timed out"), tombstone, hostile]
    for letter in letters:
        producer.produce(
            WATCHED, key=letter["key"], value=letter["value"], headers=cast(Any, letter["headers"])
        )
    assert producer.flush(30) == 0

    received: list[dict[str, Any]] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        # this test's runs: the kept metadata database holds those of earlier test runs too
        runs = [
            r
            for r in dag_runs(stack.base_url, token, "on_dead_letters")
            if datetime.fromisoformat(r["queued_at"]) >= started
        ]
        if runs and all(r["state"] in ("success", "failed") for r in runs):
            received = [
                letter
                for run in runs
                if run["state"] == "success"
                for letter in xcom_value(
                    stack.base_url, token, "on_dead_letters", run["dag_run_id"], "triage"
                )
            ]
            if len(received) >= 2:
                break
        time.sleep(2)

    assert {r["state"] for r in runs} == {"success"}, runs
    assert {r["run_type"] for r in runs} == {"asset_triggered"}
    by_id = {letter["retry_id"]: letter for letter in received}
    assert sorted(by_id) == sorted(ids), received  # each dead letter once, the tombstone not at all
    first = by_id[ids[0]]
    assert (first["dlq_topic"], first["destination"], first["dead_reason"]) == (
        WATCHED,
        "payments",
        "exhausted",
    )
    assert (first["reason"], first["error_class"], first["attempt"]) == (
        "card service timed out",
        "TimeoutError",
        "4",
    )
    assert isinstance(first["partition"], int) and isinstance(first["offset"], int) and first["key"] == ids[0]
    hostile = by_id[ids[1]]
    assert hostile["reason"].startswith("\ufffd\ufffdxxx") and hostile["reason"].endswith("...")
    assert len(hostile["reason"]) == 503  # cut to 500 characters


def test_a_bulk_replay_past_its_deadline_alerts_once_and_finishes(signals: Signals) -> None:
    stack = signals.stack

    def alerts_of(run_id: str) -> list[dict[str, Any]]:
        delivered = signals.webhook.delivered()
        return [d for d in delivered if (d.get("alert") or {}).get("fields", {}).get("run_id") == run_id]

    token = api_token(stack.base_url)
    unpause_dag(stack.base_url, token, "retry_bulk_replay")
    run_id = trigger_dag(stack.base_url, token, "retry_bulk_replay", {"dry_run": True})["dag_run_id"]
    run = wait_for_dag_run(stack.base_url, token, "retry_bulk_replay", run_id, timeout=600)
    deadline = time.monotonic() + 60  # the callback runs on the executor, beside the run
    while not alerts_of(run_id) and time.monotonic() < deadline:
        time.sleep(1)
    set_paused(stack.base_url, token, "retry_bulk_replay", True)

    assert run["state"] == "success"
    [late] = alerts_of(run_id)  # once, and no failure alert
    assert late["text"].startswith(
        f"[LATE] retry_bulk_replay run {run_id} missed its deadline\n"
        f"Run {run_id} of DAG retry_bulk_replay has not finished by its deadline, "
    )
    fields = late["alert"]["fields"]
    assert (fields["dag_id"], fields["run_id"], late["alert"]["severity"]) == (
        "retry_bulk_replay",
        run_id,
        "late",
    )
    assert fields["state"] in ("queued", "running")
