"""DAG integrity and house rules: every DAG imports cleanly and carries tags, owner, retries and docs."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.airflow


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


def test_no_import_errors(dagbag) -> None:
    assert dagbag.import_errors == {}


def test_contract_dag_ids_present(dagbag) -> None:
    assert {
        "retry_scheduler",
        "retry_bulk_replay",
        "retry_compaction",
        "dlq_replay",
        "dlq_window_replay",
        "retry_monitor",
    } <= set(dagbag.dag_ids)


def test_every_dag_follows_house_rules(dagbag) -> None:
    assert dagbag.dags
    for dag_id, dag in dagbag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        assert dag.doc_md, f"{dag_id} has no doc_md"
        for task in dag.tasks:
            assert task.owner and task.owner != "airflow", f"{dag_id}.{task.task_id} has no owner"
            assert task.retries >= 1, f"{dag_id}.{task.task_id} has no retries"


def test_every_task_alerts_on_failure_through_every_channel(dagbag) -> None:
    from retry_scheduler.airflow.notifiers import EmailNotifier, LogNotifier, WebhookNotifier

    assert dagbag.dags
    for dag_id, dag in dagbag.dags.items():
        for task in dag.tasks:
            callbacks = task.on_failure_callback
            callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
            kinds = {type(cb) for cb in callbacks}
            assert {WebhookNotifier, EmailNotifier, LogNotifier} <= kinds, (
                f"{dag_id}.{task.task_id} lacks failure_notifiers() in on_failure_callback: {callbacks}"
            )


def test_every_dag_run_alerts_when_it_fails(dagbag) -> None:
    from retry_scheduler.airflow.notifiers import EmailNotifier, LogNotifier, WebhookNotifier

    for dag_id, dag in dagbag.dags.items():
        callbacks = (
            dag.on_failure_callback
            if isinstance(dag.on_failure_callback, list)
            else [dag.on_failure_callback]
        )
        assert {WebhookNotifier, EmailNotifier, LogNotifier} <= {type(cb) for cb in callbacks}, dag_id


def test_policies_module_is_not_parsed_as_a_dag(dagbag) -> None:
    assert not any("retry_policies" in path for path in dagbag.import_errors)
    assert all(not dag.fileloc.endswith("retry_policies.py") for dag in dagbag.dags.values())


def test_spark_tasks_submit_like_the_cli(dagbag) -> None:
    # Both PySpark DAGs submit with what `retry-scheduler bulk-retry|compact` passes: the job file,
    # the JDBC driver and the class archive's --conf of this machine (added when the task runs).
    from retry_scheduler.spark.jdbc import jdbc_jars
    from retry_scheduler.spark.submit import BULK_RETRY_APP, COMPACT_APP, spark_conf

    for dag_id, task_id, app in (
        ("retry_bulk_replay", "bulk_retry", BULK_RETRY_APP),
        ("retry_compaction", "compact", COMPACT_APP),
    ):
        task = dagbag.dags[dag_id].get_task(task_id)
        assert (task.application, task.name) == (str(app), dag_id)
        # a backfill's runs compact one day at a time (one run holds the lock; the others would fail)
        assert task.max_active_tis_per_dag == (1 if dag_id == "retry_compaction" else None)
        # nothing of the machine's is looked up while the file is parsed: at run time, then as the CLI
        assert (task.jars, task.conf, task.packages) == (None, None, None)
        task.add_job_defaults()
        assert task.jars == jdbc_jars() and task.jars
        assert task.conf == spark_conf()


def test_airflow_s_own_commands_parse_every_dag_file_in_a_fresh_process(airflow_db, tmp_path) -> None:
    """As ``airflow dags reserialize`` (and a dag processor started without plugins) parse the folder.

    A DAG file named like the package (``retry_scheduler.py``) once hid the package from the other
    files of the folder, which Airflow puts on ``sys.path``: every DAG failed to import there.
    """
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags")}
    airflow = str(Path(sys.executable).parent / "airflow")

    def run(*args: str, ok: tuple[int, ...] = (0,)) -> str:
        done = subprocess.run(
            [airflow, *args], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
        )
        assert done.returncode in ok, done.stderr[-3000:]
        return done.stdout

    run("dags", "reserialize")
    listing = run("dags", "list-import-errors", "-o", "json", ok=(0, 1))  # 1: it listed some
    errors = [] if "[{" not in listing else json.loads(listing[listing.index("[{") :])
    # (an error recorded for a file no longer in the folder is history, not this checkout's)
    assert [e for e in errors if (ROOT / "dags" / e["filepath"]).exists()] == []
    out = run("dags", "list", "-o", "json")
    listed = {dag["dag_id"] for dag in json.loads(out[out.index("[{") :])}
    assert {
        "retry_scheduler",
        "retry_bulk_replay",
        "retry_compaction",
        "dlq_replay",
        "dlq_window_replay",
        "retry_monitor",
    } <= listed


def test_publish_is_mapped_into_as_many_tasks_as_retry_publish_tasks_says(monkeypatch) -> None:
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("RETRY_PUBLISH_TASKS", "3")
    dag = DagBag(dag_folder=str(ROOT / "dags" / "retry_scheduler_dag.py")).get_dag("retry_scheduler")
    publish = dag.get_task("publish")
    assert type(publish).__name__.endswith("MappedOperator")
    assert publish.op_kwargs_expand_input.value == {"shard": [0, 1, 2]}
    assert not type(dag.get_task("ingest")).__name__.endswith("MappedOperator")  # one ingest owns the topics


def test_the_spark_dags_alert_two_hours_after_a_run_was_queued_and_the_loops_have_no_deadline(dagbag) -> None:
    from datetime import timedelta

    for dag_id in ("retry_compaction", "retry_bulk_replay"):
        [deadline] = dagbag.get_dag(dag_id).deadline
        assert deadline.interval == timedelta(hours=2), dag_id
        assert type(deadline.reference).__name__ == "DagRunQueuedAtDeadline"
        assert deadline.callback.path == "retry_scheduler.airflow.deadlines.deadline_missed"
    assert not dagbag.get_dag("retry_scheduler").deadline  # bounded by dagrun_timeout instead


def test_airflow_lists_the_package_as_a_provider_and_its_plugin_once(airflow_db, tmp_path) -> None:
    """``airflow providers list`` shows the package (its ``apache_airflow_provider`` entry point) with
    the installed version, its notifiers are Airflow's known notifications, and the plugin is loaded
    once (listed among the provider's too, Airflow would load it twice and report an import error)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from retry_scheduler import __version__

    airflow = str(Path(sys.executable).parent / "airflow")

    def run(*args: str) -> str:
        done = subprocess.run([airflow, *args], env=dict(os.environ), capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    providers = json.loads(run("providers", "list", "-o", "json"))
    [ours] = [p for p in providers if p["package_name"] == "kafka-retry-scheduler"]
    assert ours["version"] == __version__, ours
    notifications = run("providers", "notifications", "-o", "json")
    assert "retry_scheduler.airflow.notifiers.WebhookNotifier" in notifications
    plugins = json.loads(run("plugins", "-o", "json"))
    assert [p["name"] for p in plugins].count("retry_scheduler") == 1, plugins
