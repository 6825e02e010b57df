"""The DAG factories' options, as a platform team uses them from its DAGs folder: ids, pools, queues,
owners, tags, access control and default args on every DAG, and a second deployment side by side
(its own connections and settings) through Airflow's real ``dag.test()``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psycopg
import pytest

from retry_scheduler.core import protocol as p
from tests.conftest import ROOT
from tests.kafkautil import consume, create_topics, produce

pytestmark = [pytest.mark.airflow]

FACTORIES = {
    "retry_scheduler": "retry_scheduler",
    "dlq_replay": "dlq_replay",
    "dlq_window_replay": "dlq_window_replay",
    "retry_monitor": "retry_monitor",
    "retry_bulk_replay": "retry_bulk_replay",
    "retry_compaction": "retry_compaction",
}


def dags_folder(tmp_path: Path, files: dict[str, str]) -> Path:
    """A DAGs folder holding ``files`` (name -> Python source) and the repository's policies."""
    folder = tmp_path / "dags"
    folder.mkdir(exist_ok=True)
    (folder / "retry_policies.py").write_text((ROOT / "dags" / "retry_policies.py").read_text())
    for name, source in files.items():
        (folder / name).write_text(textwrap.dedent(source))
    return folder


def parse(folder: Path):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(folder))


def test_every_factory_puts_the_platform_s_options_on_its_dag_and_every_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = {
        f"{name}_eu.py": f"""
            from datetime import timedelta
            from retry_scheduler.airflow.dags.{name} import {factory}_dag

            def page(context):
                pass

            dag = {factory}_dag(
                dag_id="{name}_eu", owner="payments-platform", pool="kafka", queue="eu", tags=["eu"],
                access_control={{"Viewer": {{"DAGs": {{"can_read"}}}}}},
                default_args={{"retries": 7, "retry_delay": timedelta(minutes=3), "on_failure_callback": page}},
                postgres_conn_id="retry_postgres_eu", kafka_conn_id="retry_kafka_eu",
                settings={{"RETRY_TOPIC": "retry-eu", "RETRY_PUBLISH_TASKS": "2"}},
            )
        """
        for name, factory in FACTORIES.items()
    }
    bag = parse(dags_folder(tmp_path, sources))
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == sorted(f"{name}_eu" for name in FACTORIES)
    for name in FACTORIES:
        dag = bag.get_dag(f"{name}_eu")
        assert "retry-scheduler" in dag.tags and "eu" in dag.tags, name
        assert dag.access_control == {"Viewer": {"DAGs": {"can_read"}}}, name
        assert dag.fileloc == str(tmp_path / "dags" / f"{name}_eu.py")
        for task in dag.tasks:
            where = f"{name}.{task.task_id}"
            assert (task.owner, task.pool, task.queue) == ("payments-platform", "kafka", "eu"), where
            assert (task.retries, task.retry_delay.total_seconds()) == (7, 180), where
            # the team's callback runs after the service's own failure alerts, not instead
            callbacks = task.on_failure_callback
            assert len(callbacks) >= 2 and callbacks[-1].__name__ == "page", where
    publish = bag.get_dag("retry_scheduler_eu").get_task("publish")
    assert publish.op_kwargs_expand_input.value == {"shard": [0, 1]}  # the deployment's RETRY_PUBLISH_TASKS
    for name, task_id in (("retry_bulk_replay", "bulk_retry"), ("retry_compaction", "compact")):
        hook = bag.get_dag(f"{name}_eu").get_task(task_id).retry_hook
        assert (hook.postgres_conn_id, hook.kafka_conn_id) == ("retry_postgres_eu", "retry_kafka_eu")
        assert hook.environment == {"RETRY_TOPIC": "retry-eu", "RETRY_PUBLISH_TASKS": "2"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            'tags="eu"',
            "retry_scheduler_dag(): tags must be a list of strings, e.g. tags=['eu']",
        ),
        (
            'settings={"RETRY_DATABASE_URL": "postgresql://u:secret@db/retry"}',
            "retry_scheduler_dag(): settings may not hold RETRY_DATABASE_URL: it belongs in a connection, "
            "named by postgres_conn_id= (a DAG's arguments show in the UI)",
        ),
        (
            'settings={"RETRY_TOPICS": "retry-eu"}',
            "retry_scheduler_dag(): settings has no 'RETRY_TOPICS': its keys are the service's environment "
            "variables, ",
        ),
        (
            'settings={"RETRY_INGEST_BATCH": 500}',
            "retry_scheduler_dag(): settings['RETRY_INGEST_BATCH'] must be a string, as in the environment",
        ),
        ('settings={"RETRY_INGEST_BATCH": "many"}', "RETRY_INGEST_BATCH='many' must be an integer"),
        (
            'pools="kafka"',
            "retry_scheduler_dag() takes no option pools: its options are dag_id, owner, pool, queue, tags, ",
        ),
        ('pool=""', "retry_scheduler_dag(): pool must be a non-empty string, not ''"),
    ],
)
def test_a_mistaken_option_is_an_import_error_that_names_it_and_never_a_password(
    tmp_path: Path, options: str, message: str
) -> None:
    source = f"""
        from retry_scheduler.airflow.dags.retry_scheduler import retry_scheduler_dag

        dag = retry_scheduler_dag({options})
    """
    bag = parse(dags_folder(tmp_path, {"retry_scheduler_eu.py": source}))
    [error] = bag.import_errors.values()
    assert message in error
    assert "secret" not in error.split("retry_scheduler_dag(")[-1].split("\n")[-2]  # the error's own line


@pytest.mark.integration
def test_a_second_deployment_side_by_side_works_on_its_own_database_and_topics(
    airflow_db,
    database_url: str,
    module_database_url: str,
    bootstrap_servers: str,
    topic_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first_topic, eu_topic = f"{topic_prefix}-retry", f"{topic_prefix}-retry-eu"
    dest = f"{topic_prefix}-orders"
    kafka = json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap_servers}})
    for key, value in {
        # the first deployment: the default connections and the environment's settings
        "AIRFLOW_CONN_RETRY_POSTGRES": database_url,
        "AIRFLOW_CONN_RETRY_KAFKA": kafka,
        "RETRY_TOPIC": first_topic,
        "RETRY_CONSUMER_GROUP": f"{topic_prefix}-scheduler",
        # the second: its own connections, named in its DAG file
        "AIRFLOW_CONN_RETRY_POSTGRES_EU": module_database_url,
        "AIRFLOW_CONN_RETRY_KAFKA_EU": kafka,
        "RETRY_CREATE_TOPICS": "true",
        "RETRY_LOOP_GRACE_MS": "0",  # dag.test() runs one task at a time: no loop ever relieves another
    }.items():
        monkeypatch.setenv(key, value)
    folder = dags_folder(
        tmp_path,
        {
            "retry_scheduler_dag.py": """
                from retry_scheduler.airflow.dags.retry_scheduler import retry_scheduler_dag

                dag = retry_scheduler_dag()
            """,
            "retry_scheduler_eu.py": f"""
                from retry_scheduler.airflow.dags.retry_scheduler import retry_scheduler_dag

                dag = retry_scheduler_dag(
                    dag_id="retry_scheduler_eu",
                    postgres_conn_id="retry_postgres_eu",
                    kafka_conn_id="retry_kafka_eu",
                    settings={{"RETRY_TOPIC": "{eu_topic}", "RETRY_CONSUMER_GROUP": "{topic_prefix}-eu"}},
                )
            """,
        },
    )
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(folder))
    create_topics(bootstrap_servers, [dest, first_topic, eu_topic])
    now = int(time.time() * 1000)
    headers = [("retry.destination", dest.encode()), ("retry.at", str(now).encode())]
    produce(bootstrap_servers, eu_topic, [{"key": b"eu", "value": b"1", "headers": headers}])
    produce(bootstrap_servers, first_topic, [{"key": b"first", "value": b"2", "headers": headers}])

    assert parse(folder).import_errors == {}
    # `airflow dags test` (dag.test() in a process of its own, which reads this DAGs folder); the two
    # tasks run one after the other, in either order: two runs see everything through.
    airflow = str(Path(sys.executable).parent / "airflow")
    for _ in range(2):
        done = subprocess.run(
            [airflow, "dags", "test", "retry_scheduler_eu", "--conf", '{"loop_seconds": 8}'],
            env=os.environ.copy(), capture_output=True, text=True, timeout=300, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        assert "state=success" in done.stdout + done.stderr

    [seen] = consume(bootstrap_servers, [dest], 1)
    assert (seen.key, seen.header(p.ATTEMPT)) == (b"eu", "1")
    with psycopg.connect(module_database_url) as conn:
        assert conn.execute("SELECT msg_key, status::text FROM retry_jobs_all").fetchall() == [
            (b"eu", "published")
        ]
    with psycopg.connect(database_url) as conn:  # the first deployment's: untouched, its record not read
        assert conn.execute("SELECT count(*) FROM retry_jobs_all").fetchone() == (0,)
