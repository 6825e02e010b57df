"""The loops' metrics arrive through Airflow's own metrics layer, as the deployment configured it.

The dev stack's scheduler runs the ``retry_scheduler`` DAG with ``[metrics] statsd_on`` pointing at a
UDP socket of this test: what arrives there is what a StatsD server (or the Prometheus StatsD
exporter) of a deployment would receive from the loops' task processes.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import Producer

from retry_scheduler.core import protocol
from retry_scheduler.core.metrics import METRICS
from retry_scheduler.dev.airflow_api import api_token, trigger_dag, unpause_dag
from retry_scheduler.dev.demo import warm_up
from tests.e2e.stacks import new_dev_stack
from tests.kafkautil import consume, create_topics

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


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


def test_the_loops_report_counts_backlog_and_lateness_through_airflow_statsd(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = StatsdReceiver()
    for key, value in {"STATSD_ON": "True", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(receiver.port),
                       "STATSD_PREFIX": "airflow"}.items():  # fmt: skip
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key}", value)
    stack = new_dev_stack(database_url, tmp_path, "retry_airflow_metrics_", triggerer=False)
    settings = stack.settings
    destination = f"demo.metrics-{uuid.uuid4().hex[:8]}"  # dags/retry_policies.py allows demo.*
    try:
        with stack:
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
        receiver.close()

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
    lateness = seen["airflow.retry_scheduler.publish.lateness_p99"]
    assert {kind for _, kind in lateness} == {"ms"} and all(value >= 0 for value, _ in lateness), lateness
    # Airflow's own task metrics come through the same backend: the metrics layer is Airflow's.
    assert any(name.startswith("airflow.ti.") or name.startswith("airflow.task.") for name in seen)
