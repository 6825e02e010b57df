"""retry_monitor through Airflow's real ``dag.test()``: a crossed threshold posts one alert to the
webhook connection, and a failing task reaches the same webhook through the failure callbacks (the
task's, then the run's)."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest

from bench.jobs import insert_jobs
from retry_scheduler.core.jobs import Status
from retry_scheduler.db.store import Store
from retry_scheduler.dev.procs import free_port
from tests.conftest import ROOT
from tests.integration.test_alert_channels import slack as slack  # the fixture: a declared Slack channel
from tests.integration.test_monitor import WebhookReceiver, make_job
from tests.integration.test_monitor import (
    webhook as webhook,  # the fixture: the receiver as retry_alert_webhook
)

pytestmark = [pytest.mark.airflow, pytest.mark.integration]


def monitor_dag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags")).get_dag("retry_monitor")


def failed_run(monkeypatch: pytest.MonkeyPatch):
    """A ``retry_monitor`` run whose ``check`` fails (PostgreSQL out of reach), through ``dag.test()``."""
    monkeypatch.setenv("AIRFLOW_CONN_RETRY_POSTGRES", f"postgresql://postgres@127.0.0.1:{free_port()}/retry")
    dag = monitor_dag()
    # dag.test() would wait out the retry delay before the final failure: the first failure is final here.
    dag.get_task("check").retries = 0
    return dag.test()


def test_crossed_threshold_posts_one_alert_across_runs(
    airflow_db, database_url: str, webhook: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.utils.state import DagRunState

    monkeypatch.setenv("AIRFLOW_CONN_RETRY_POSTGRES", database_url)
    # The Variable moves the thresholds: 3 dead jobs fire, a job overdue by 2 minutes does not.
    monkeypatch.setenv(
        "AIRFLOW_VAR_RETRY_MONITOR_THRESHOLDS", json.dumps({"dead_per_hour": 2, "oldest_overdue_s": 600})
    )
    with Store(database_url) as store:
        insert_jobs(store, [make_job(1, due_s_ago=120)])
        insert_jobs(store, [make_job(10 + n, status=Status.DEAD, destination="payments") for n in range(3)])

    dag = monitor_dag()
    runs = [dag.test() for _ in range(2)]

    assert [r.state for r in runs] == [DagRunState.SUCCESS, DagRunState.SUCCESS]
    [fired] = webhook.delivered()
    assert fired["text"].startswith("[FIRING] retry_monitor: 3 jobs went dead in the last hour (threshold 2)")
    assert fired["alert"]["fields"]["by_destination"] == {"payments": 3}
    first, second = (next(ti.xcom_pull(task_ids="check") for ti in r.get_task_instances()) for r in runs)
    assert [a["check"] for a in first["alerts"]] == ["dead_per_hour"]
    assert first["thresholds"]["oldest_overdue_s"] == 600
    assert first["reading"]["oldest_overdue_destination"] == "orders"
    assert (second["alerts"], second["firing"]) == ([], ["dead_per_hour"])


def test_failing_task_alerts_through_the_failure_callback(
    airflow_db, webhook: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.utils.state import DagRunState

    run = failed_run(monkeypatch)

    assert run.state == DagRunState.FAILED
    # one alert for the task, then one for the run (the DAG's own failure callback)
    failure, run_failed = webhook.delivered()
    assert run_failed["text"] == (
        f"[FAILED] retry_monitor run failed\nRun {run.run_id} of DAG retry_monitor failed: a task failed (check)"
    )
    assert run_failed["alert"]["fields"] == {
        "dag_id": "retry_monitor",
        "run_id": run.run_id,
        "reason": "task_failure",
        "task_id": "check",
    }
    assert failure["text"].startswith(
        "[FAILED] retry_monitor.check failed\nTask check of DAG retry_monitor failed"
    )
    assert "StoreError: cannot connect to PostgreSQL at postgresql://postgres@127.0.0.1:" in failure["text"]
    fields = failure["alert"]["fields"]
    assert (fields["dag_id"], fields["task_id"], fields["run_id"]) == ("retry_monitor", "check", run.run_id)
    assert fields["log_url"].endswith(
        f"/dags/retry_monitor/runs/{quote(run.run_id)}/tasks/check?try_number=1"
    )


def test_a_failure_reaches_the_channels_declared_next_to_the_policies(
    airflow_db, slack: WebhookReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.utils.state import DagRunState

    run = failed_run(monkeypatch)

    assert run.state == DagRunState.FAILED
    # the task's failure callback, then the run's: both rendered by the SlackWebhookNotifier
    task_failed, run_failed = (post["text"] for post in slack.delivered())
    assert task_failed.startswith(
        "[FAILED] retry_monitor.check failed\nTask check of DAG retry_monitor failed"
    )
    assert "StoreError: cannot connect to PostgreSQL" in task_failed
    assert run_failed == (
        f"[FAILED] retry_monitor run failed\nRun {run.run_id} of DAG retry_monitor failed: a task failed (check)"
    )
