"""The PySpark DAGs through Airflow's real ``dag.test()`` (SparkSubmitOperator, spark-submit, local
mode), and the CLI twins that run the same jobs."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pyarrow.parquet as pq
import pytest

from bench.jobs import Job, insert_jobs
from retry_scheduler.cli.main import main
from retry_scheduler.core import protocol as p
from retry_scheduler.core.jobs import Status
from retry_scheduler.db.store import Store
from tests.conftest import ROOT
from tests.jobrows import publish
from tests.kafkautil import consume, create_topics

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.integration]


def dead_job(offset: int, destination: str) -> Job:
    now = int(time.time() * 1000)
    return Job(
        source_topic="retry", source_partition=0, source_offset=offset, source_timestamp_ms=now,
        destination=destination, destination_partition=None, key=f"k{offset}".encode(), value=b"\x00v",
        headers=(("trace", b"\xff"),), attempt=3, policy="default", reason="psp down",
        error_class="psp.Timeout", consumer_group="payments-app", retry_id=f"rid-{offset}",
        original_topic=destination, original_partition=None, original_offset=offset,
        original_timestamp_ms=now, due_ms=now, status=Status.DEAD, dead_reason="exhausted", dlq_topic="retry.dlq",
    )  # fmt: skip


@pytest.fixture
def airflow_env(
    monkeypatch: pytest.MonkeyPatch, database_url: str, bootstrap_servers: str, tmp_path: Path
) -> Path:
    venv_bin = str(Path(sys.executable).parent)
    archive = tmp_path / "archive"
    for key, value in {
        "AIRFLOW_CONN_RETRY_POSTGRES": database_url,
        "AIRFLOW_CONN_RETRY_KAFKA": json.dumps(
            {"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap_servers}}
        ),
        "AIRFLOW_CONN_SPARK_DEFAULT": "spark://local%5B2%5D?deploy-mode=client",
        "RETRY_DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers,
        "RETRY_ARCHIVE_URI": archive.as_uri(),
        "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}",
        "PYSPARK_PYTHON": sys.executable,
    }.items():
        monkeypatch.setenv(key, value)
    return archive


def get_dag(dag_id: str):
    """The DAG from the DAGs folder, for ``dag.test()``: without its Deadline Alert, which makes
    Airflow 3.3's ``dag.test()`` fail once the run succeeded (apache/airflow#73428). The deadline
    itself is tested under the real scheduler (tests/e2e/test_signals.py)."""
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(ROOT / "dags")).get_dag(dag_id)
    dag.deadline = None
    return dag


def test_bulk_replay_dag_dry_run_then_replay(
    airflow_db, airflow_env: Path, database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    from airflow.utils.state import DagRunState

    dest, other = f"{topic_prefix}-payments", f"{topic_prefix}-orders"
    create_topics(bootstrap_servers, [dest, other])
    with Store(database_url) as store:
        insert_jobs(
            store, [dead_job(i, dest) for i in range(30)] + [dead_job(100 + i, other) for i in range(5)]
        )
    dag = get_dag("retry_bulk_replay")

    dry = dag.test(run_conf={"destination": dest})  # the form's default is a dry run
    assert dry.state == DagRunState.SUCCESS
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM retry_jobs_all WHERE status = 'dead'").fetchone() == (35,)

    run = dag.test(run_conf={"destination": dest, "dry_run": False})
    assert run.state == DagRunState.SUCCESS
    seen = consume(bootstrap_servers, [dest], 30)
    assert sorted(s.key for s in seen) == sorted(f"k{i}".encode() for i in range(30))
    assert {s.header(p.ATTEMPT) for s in seen} == {"4"}
    with psycopg.connect(database_url) as conn:
        counts = dict(
            conn.execute(
                "SELECT destination, count(*) FROM retry_jobs_all WHERE status = 'published' GROUP BY 1"
            ).fetchall()
        )
    assert counts == {dest: 30}
    # Both runs are audited as bulk replays asked for from the DAG, under their Airflow run ids.
    with psycopg.connect(database_url) as conn:
        audits = conn.execute(
            "SELECT action, dry_run, source, run_id, matched, affected FROM retry_dlq_audit ORDER BY id"
        ).fetchall()
    assert audits == [
        ("bulk_replay", True, "dag", re.sub(r"[^A-Za-z0-9._:-]", "_", dry.run_id), 30, 0),
        ("bulk_replay", False, "dag", re.sub(r"[^A-Za-z0-9._:-]", "_", run.run_id), 30, 30),
    ]
    # The replay (not the dry run) updated the replays asset with what it did.
    from tests.airflow.test_dlq_window_replay_dag import replay_events

    assert replay_events("retry_bulk_replay", dry.run_id) == []
    [event] = replay_events("retry_bulk_replay", run.run_id)
    assert (event["action"], event["matched"], event["replayed"]) == ("bulk_replay", 30, 30)
    assert event["filter"]["destination"] == dest


def test_compaction_dag_archives_its_logical_day(airflow_db, airflow_env: Path, database_url: str) -> None:
    from airflow.utils.state import DagRunState

    with Store(database_url) as store:
        insert_jobs(
            store,
            [replace(dead_job(i, "orders"), status=Status.PENDING, dead_reason=None) for i in range(12)],
        )
    with psycopg.connect(database_url) as conn:
        publish(conn, "id <= 10", at=datetime(2026, 11, 20, 10, tzinfo=UTC))
        publish(conn, "id > 10", at=datetime(2026, 11, 19, 10, tzinfo=UTC))

    # A run processes its data interval: triggered at 2026-11-21 00:00, that is the whole of 2026-11-20.
    run = get_dag("retry_compaction").test(logical_date=datetime(2026, 11, 21, tzinfo=UTC))
    assert run.state == DagRunState.SUCCESS
    table = pq.read_table(airflow_env / "retry_jobs")
    assert table.num_rows == 10
    assert set(table.column("day").to_pylist()) == {"2026-11-20"}
    with psycopg.connect(database_url) as conn:
        left = conn.execute(
            "SELECT published_at::date::text, count(*) FROM retry_jobs_all GROUP BY 1"
        ).fetchall()
    assert left == [("2026-11-19", 2)]  # the other day stays until its own run

    # The run updated the archive's Asset, for downstream DAGs scheduled on it, with its day.
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from retry_scheduler.airflow.assets import ARCHIVE_ASSET

    with create_session() as session:
        events = session.execute(
            select(AssetModel.name, AssetModel.uri, AssetEvent.extra)
            .join(AssetEvent, AssetEvent.asset_id == AssetModel.id)
            .where(AssetEvent.source_dag_id == "retry_compaction", AssetEvent.source_run_id == run.run_id)
        ).all()
    assert [tuple(e) for e in events] == [
        (ARCHIVE_ASSET, ARCHIVE_ASSET, {"day": "2026-11-20", "archive": airflow_env.as_uri()})
    ]


def test_cli_bulk_retry_and_compact(
    airflow_env: Path,
    database_url: str,
    bootstrap_servers: str,
    topic_prefix: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    dest = f"{topic_prefix}-payments"
    create_topics(bootstrap_servers, [dest])
    with Store(database_url) as store:
        insert_jobs(store, [dead_job(i, dest) for i in range(40)])

    assert main(["bulk-retry", "--destination", dest, "--dry-run"]) == 0
    assert capfd.readouterr().out == "dry run: 40 dead jobs would be re-published (nothing changed)\n"
    assert main(["bulk-retry", "--destination", dest, "--dry-run", "--json"]) == 0
    assert json.loads(capfd.readouterr().out)["selected"] == 40
    assert main(["bulk-retry", "--destination", dest]) == 0
    out, err = capfd.readouterr()
    assert re.fullmatch(r"published 40 of 40 selected dead jobs, 0 failed \(run [\w:.-]+\)\n", out), out
    assert len(consume(bootstrap_servers, [dest], 40)) == 40
    # the job's progress, from its driver's status tracker: lines on stderr when it is no terminal
    steps = re.findall(r"^bulk-retry: ([\d,]+)/([\d,]+) Spark tasks$", err, re.MULTILINE)
    assert steps and steps[-1][0] == steps[-1][1] != "0", err[-2000:]
    assert "PROGRESS" not in out + err  # the job's raw lines became the progress, not output

    assert main(["compact", "--older-than", "0s", "--json"]) == 0
    out, err = capfd.readouterr()
    result = json.loads(out)
    assert result["deleted"] == 40
    steps = re.findall(r"^compact: ([\d,]+)/([\d,]+) Spark tasks$", err, re.MULTILINE)
    assert steps and steps[-1][0] == steps[-1][1] != "0", err[-2000:]
    assert pq.read_table(airflow_env / "retry_jobs").num_rows == 40
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM retry_jobs_all").fetchone() == (0,)


def test_in_a_terminal_compact_shows_the_job_s_progress_as_a_bar(
    airflow_env: Path, database_url: str
) -> None:
    from tests.terminal import run_in_terminal

    with Store(database_url) as store:
        insert_jobs(
            store,
            [replace(dead_job(i, "orders"), status=Status.PENDING, dead_reason=None) for i in range(10)],
        )
    with psycopg.connect(database_url) as conn:
        publish(conn, "true", at=datetime.now(UTC) - timedelta(days=1))
    command = [
        str(Path(sys.executable).parent / "retry-scheduler"),
        "compact",
        "--older-than",
        "1h",
    ]

    code, text, out = run_in_terminal(command, dict(os.environ))

    assert code == 0, text[-3000:]
    assert re.search(r"compact ━+ (\d+)/\1 Spark tasks 100%", text), text[-3000:]
    assert not re.search(r"compact: \d+/\d+ Spark tasks", text)  # the plain lines are for pipes and logs
    assert out.startswith(
        "archived 10 jobs (0 were already in the archive), deleted 10 from PostgreSQL; manifest "
    )


@pytest.mark.cluster
def test_both_dags_run_their_jobs_on_the_cluster_spark_default_names(
    airflow_db,
    airflow_env: Path,
    spark_cluster,
    database_url: str,
    bootstrap_servers: str,
    topic_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from airflow.utils.state import DagRunState

    from tests.conftest import BASE_PYTHON
    from tests.spark.test_cluster import completed_apps, executors_of

    host, port = spark_cluster.url.removeprefix("spark://").split(":")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", f"spark://{host}:{port}?deploy-mode=client")
    monkeypatch.setenv("RETRY_SPARK_EXECUTOR_PYTHON", BASE_PYTHON)  # no packages: they come with the job
    monkeypatch.setenv("RETRY_DEV_HOME", str(tmp_path / "dev"))
    monkeypatch.delenv("PYSPARK_PYTHON")
    before = frozenset(app["id"] for app in spark_cluster.status()["completedapps"])
    dest = f"{topic_prefix}-payments"
    create_topics(bootstrap_servers, [dest])
    with Store(database_url) as store:
        insert_jobs(store, [dead_job(i, dest) for i in range(30)])

    replay = get_dag("retry_bulk_replay").test(run_conf={"destination": dest, "dry_run": False})
    assert replay.state == DagRunState.SUCCESS
    assert sorted(s.key for s in consume(bootstrap_servers, [dest], 30)) == sorted(
        f"k{i}".encode() for i in range(30)
    )
    with psycopg.connect(database_url) as conn:
        conn.execute("UPDATE retry_published_jobs SET published_at = '2026-11-20 10:00:00+00'")
    compaction = get_dag("retry_compaction").test(logical_date=datetime(2026, 11, 21, tzinfo=UTC))
    assert compaction.state == DagRunState.SUCCESS
    assert pq.read_table(airflow_env / "retry_jobs").num_rows == 30
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM retry_jobs_all").fetchone() == (0,)

    apps = completed_apps(spark_cluster, 2, since=before)
    assert sorted(apps.values()) == ["retry-compaction", "retry_bulk_retry"], apps
    assert set(apps) <= set(executors_of(spark_cluster))  # executors on the worker, for both


@pytest.mark.parametrize(
    ("connection", "niced"),
    [
        ("spark://local%5B2%5D?deploy-mode=client", True),
        ("spark://spark-master:7077?deploy-mode=client", False),
    ],
)
def test_a_local_job_s_spark_submit_yields_the_cpu_and_a_cluster_s_does_not(
    monkeypatch: pytest.MonkeyPatch, connection: str, niced: bool
) -> None:
    """The operator's spark-submit runs through ``nice`` in local mode (RETRY_SPARK_LOCAL_NICE, default
    10), the task's own process keeping its priority; on a cluster the command is the provider's."""
    from retry_scheduler.airflow.operators import RetrySparkSubmitOperator

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", connection)
    monkeypatch.delenv("RETRY_SPARK_LOCAL_NICE", raising=False)
    own = os.nice(0)
    task = RetrySparkSubmitOperator(task_id="job", application="job.py", name="job")
    command = task._get_hook()._build_spark_submit_command("job.py")
    assert command[-1] == "job.py" and any(part.endswith("spark-submit") for part in command)
    if niced:
        assert Path(command[0]).name == "nice" and command[1:3] == ["-n", "10"]
    else:
        assert Path(command[0]).name != "nice" and "nice" not in command
    assert os.nice(0) == own
