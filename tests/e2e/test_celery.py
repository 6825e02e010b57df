"""The ``retry_scheduler`` DAG under Airflow's real scheduler with the CeleryExecutor: the scheduler
queues its tasks in Redis and a real Celery worker (``airflow celery worker``) runs them.

Redis is a ``redis-server`` of the test's own on a free port, started by the dev tooling because none
answers there (the machine's Redis is left alone). While the workload runs, a run with 15-second
loops is triggered every 15 s, so the loops of one run must hand over to the next on the worker (the
scheduled runs loop for 90 s each; waiting for two of them took three minutes). It waits more than it
computes and asserts no timing, so it runs beside the other tests (``pytest -m cluster`` runs it alone).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from retry_scheduler.core import protocol
from retry_scheduler.core.config import Settings
from retry_scheduler.dev.airflow_api import api_token, trigger_dag, unpause_dag
from retry_scheduler.dev.demo import warm_up
from retry_scheduler.dev.procs import free_port, port_open
from retry_scheduler.dev.stack import DevStack
from retry_scheduler.loops.kafka import RETRY_TOPIC_PARTITIONS
from tests.conftest import _db_url, checkout_database
from tests.e2e.stacks import PARSE_INTERVAL_S
from tests.kafkautil import consume, create_topics

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.cluster]

#: One record every SPACING_S seconds for SECONDS, each due DUE_IN_MS after it was sent.
SECONDS, SPACING_S, DUE_IN_MS = 30, 0.5, 3_000
#: The loop_seconds of the runs the test triggers, one every RUN_LOOP_S while the workload runs
#: (the workload spans three runs' loops, each handing over to the next).
RUN_LOOP_S = 10


def send_steadily(bootstrap: str, retry_topic: str, destination: str) -> dict[bytes, int]:
    """The workload: key -> the retry.at it carries (ms)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    due: dict[bytes, int] = {}
    began = time.monotonic()
    for index in range(int(SECONDS / SPACING_S)):
        at_ms = int(time.time() * 1000) + DUE_IN_MS
        key = f"celery-{index}".encode()
        headers = [(protocol.DESTINATION, destination.encode()), (protocol.AT, str(at_ms).encode())]
        producer.produce(retry_topic, key=key, value=b"{}", headers=cast(Any, headers))
        producer.poll(0)
        due[key] = at_ms
        time.sleep(max(0.0, began + (index + 1) * SPACING_S - time.monotonic()))
    assert producer.flush(30) == 0
    return due


def test_retries_come_back_never_early_from_loops_on_a_celery_worker(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="retry_scheduler.dev")
    # Two publish tasks per run, side by side on the worker: they share the due jobs (SKIP LOCKED).
    monkeypatch.setenv("RETRY_PUBLISH_TASKS", "2")
    settings = Settings(database_url=database_url, kafka={"bootstrap.servers": f"127.0.0.1:{free_port()}"})
    settings = settings.with_overrides(create_topics=True)
    redis_port = free_port()
    notes: list[str] = []
    stack = DevStack(
        settings,
        api_port=free_port(),
        metadata_db=checkout_database("retry_airflow_celery_"),
        airflow_home=tmp_path / "airflow",
        executor="celery",
        redis_url=f"redis://127.0.0.1:{redis_port}/0",
        say=notes.append,
        parse_interval_s=PARSE_INTERVAL_S,
        triggerer=False,  # nothing defers
    )
    stack.log_dir = tmp_path / "logs"
    stack.kafka_home = tmp_path / "kafka"  # a broker of its own: a stack on the default port keeps .dev/kafka
    destination = f"demo.celery-{uuid.uuid4().hex[:8]}"  # dags/retry_policies.py allows demo.*
    began = datetime.now(UTC)
    with stack:
        assert any(f"Redis started on 127.0.0.1:{redis_port}" in note for note in notes), notes
        # The stack created the retry topic as the ingest does, before the DAG ran or anything was sent
        # to it (a first record would have had the broker make it with 1 partition).
        topics = AdminClient({"bootstrap.servers": settings.bootstrap_servers}).list_topics(timeout=10).topics
        assert len(topics[settings.retry_topic].partitions) == RETRY_TOPIC_PARTITIONS
        create_topics(settings.bootstrap_servers, [destination])
        token = api_token(stack.base_url)
        unpause_dag(stack.base_url, token, "retry_scheduler")
        short_loops = {"loop_seconds": RUN_LOOP_S}
        trigger_dag(stack.base_url, token, "retry_scheduler", conf=short_loops)
        warm_up(settings, uuid.uuid4().hex[:6], 300)
        box: list[dict[bytes, int]] = []
        sender = threading.Thread(
            target=lambda: box.append(
                send_steadily(settings.bootstrap_servers, settings.retry_topic, destination)
            )
        )
        sender.start()
        sender.join(RUN_LOOP_S)
        while sender.is_alive():
            trigger_dag(stack.base_url, token, "retry_scheduler", conf=short_loops)
            sender.join(RUN_LOOP_S)
        due = box[0]
        seen = consume(settings.bootstrap_servers, [destination], len(due), timeout_s=120)
        deadline = time.monotonic() + 120
        while True:  # the runs the workload spanned finish as their successors relieve them
            with psycopg.connect(_db_url(stack.metadata_db)) as conn:
                rows = conn.execute(
                    "SELECT run_id, task_id, map_index, external_executor_id FROM task_instance"
                    " WHERE dag_id = 'retry_scheduler' AND state = 'success' AND start_date >= %s",
                    (began,),  # the metadata database is kept between test runs
                ).fetchall()
            by_run: dict[str, set[tuple[str, int]]] = defaultdict(set)
            for run_id, task_id, map_index, _executor_id in rows:
                by_run[run_id].add((task_id, map_index))
            loops = {("ingest", -1), ("publish", 0), ("publish", 1)}
            complete = [run for run, tasks in by_run.items() if tasks >= loops]
            if len(complete) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(2)
        worker_log = (stack.log_dir / "celery-worker-0.log").read_text(errors="replace")
    assert not port_open("127.0.0.1", redis_port), "the stack's Redis outlived the stack"
    # Stopping the stack asked the running loops to end (SIGTERM): the worker running them, which
    # waits for its tasks, did not have to be killed. (Other services' stops are Airflow's own.)
    killed = [r.getMessage() for r in caplog.records if "SIGKILL" in r.getMessage()]
    assert [line for line in killed if line.startswith(("celery-worker", "scheduler"))] == []

    # Every record came back once (two publish tasks at a time, never the same job twice), none early.
    assert sorted(s.key for s in seen if s.key) == sorted(due)
    early = [(s.key, s.timestamp_ms - due[s.key]) for s in seen if s.key and s.timestamp_ms < due[s.key]]
    assert early == []
    # The loops ran as Celery tasks (Celery's task id is the executor's id of each task instance), and
    # at least two runs' loops (ingest and both publish tasks) finished, each relieved by the next:
    # the handover worked on the worker.
    assert rows and all(executor_id for *_ids, executor_id in rows), rows
    assert len(complete) >= 2, dict(by_run)
    assert "retry_scheduler" in worker_log, worker_log[-3000:]
