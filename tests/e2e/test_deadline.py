"""Deadline Alerts under the dev stack's scheduler: a ``retry_bulk_replay`` run still going after its
deadline alerts through the failure channels (here the webhook, a local receiver), once, while the
run goes on to finish."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from retry_scheduler.dev.airflow_api import api_token, trigger_dag, unpause_dag, wait_for_dag_run
from tests.e2e.stacks import new_dev_stack
from tests.integration.test_monitor import WebhookReceiver
from tests.integration.test_monitor import webhook as webhook  # the fixture: retry_alert_webhook

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

THIN_DAG_FILE = """
from datetime import timedelta

from retry_scheduler.airflow.dags.retry_bulk_replay import retry_bulk_replay_dag

# a deadline no Spark job meets: its JVM alone takes longer to start
dag = retry_bulk_replay_dag(deadline=timedelta(seconds=2))
"""


def test_a_bulk_replay_past_its_deadline_alerts_once_and_finishes(
    database_url: str, tmp_path: Path, webhook: WebhookReceiver
) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "retry_bulk_replay.py").write_text(THIN_DAG_FILE)
    stack = new_dev_stack(database_url, tmp_path, "retry_airflow_deadline_", dags_folder=dags)
    with stack:
        token = api_token(stack.base_url)
        unpause_dag(stack.base_url, token, "retry_bulk_replay")
        run_id = trigger_dag(stack.base_url, token, "retry_bulk_replay", {"dry_run": True})["dag_run_id"]
        run = wait_for_dag_run(stack.base_url, token, "retry_bulk_replay", run_id, timeout=600)
        deadline = time.monotonic() + 60  # the callback runs on the executor, beside the run
        while not webhook.delivered() and time.monotonic() < deadline:
            time.sleep(1)

    assert run["state"] == "success"
    [late] = webhook.delivered()  # once, and no failure alert
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
