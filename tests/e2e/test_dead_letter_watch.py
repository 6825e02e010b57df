"""The example DAG ``examples/dags/on_dead_letters.py`` runs when dead letters appear on the DLQ topic.

The dev stack's triggerer runs the asset's watcher (the Kafka provider's AwaitMessageTrigger) against
the stack's broker; the scheduler starts the DAG on the asset events; its task receives every dead
letter, a hostile one included, and a tombstone starts nothing.
"""

from __future__ import annotations

import shutil
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import Producer

from retry_scheduler.core import protocol
from retry_scheduler.dev.airflow_api import api_token, dag_runs, unpause_dag, xcom_value
from tests.conftest import ROOT
from tests.e2e.stacks import new_dev_stack, reparse
from tests.kafkautil import create_topics

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

DLQ = "retry.dlq"


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


def test_dead_letters_start_the_example_dag_with_each_letter(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(ROOT / "examples" / "dags" / "on_dead_letters.py", dags)
    monkeypatch.setenv("RETRY_DLQ_WATCH_TOPICS", DLQ)
    stack = new_dev_stack(database_url, tmp_path, "retry_airflow_watch_", dags_folder=dags)
    ids = [f"dl-{uuid.uuid4().hex[:6]}-{n}" for n in range(2)]
    started = datetime.now(UTC)
    with stack:
        bootstrap = stack.settings.bootstrap_servers
        create_topics(bootstrap, [DLQ])
        token = api_token(stack.base_url)
        unpause_dag(stack.base_url, token, "on_dead_letters")
        # Airflow registers an asset's watcher when it parses the DAG unpaused: as it would on its own
        # within the parse interval (30 s in a dev stack, 10 min in the tests' stacks).
        reparse(stack, "on_dead_letters.py")
        producer = Producer({"bootstrap.servers": bootstrap})
        # hostile: a reason of invalid UTF-8 and 100 000 bytes, the retry id given twice
        hostile = dead_letter(ids[1], "orders", b"\xff\xfe" + b"x" * 100_000)
        hostile["headers"].append((protocol.ID, b"second-id-ignored"))
        tombstone = {"key": b"gone", "value": None, "headers": []}  # not a dead letter
        letters = [dead_letter(ids[0], "payments", "card service timed out"), tombstone, hostile]
        for letter in letters:
            producer.produce(
                DLQ, key=letter["key"], value=letter["value"], headers=cast(Any, letter["headers"])
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
    assert (first["dlq_topic"], first["destination"], first["dead_reason"]) == (DLQ, "payments", "exhausted")
    assert (first["reason"], first["error_class"], first["attempt"]) == (
        "card service timed out",
        "TimeoutError",
        "4",
    )
    assert isinstance(first["partition"], int) and isinstance(first["offset"], int) and first["key"] == ids[0]
    hostile = by_id[ids[1]]
    assert hostile["reason"].startswith("\ufffd\ufffdxxx") and hostile["reason"].endswith("...")
    assert len(hostile["reason"]) == 503  # cut to 500 characters
