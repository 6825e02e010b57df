"""Both Spark jobs on a real Spark standalone cluster: a master and a worker as JVMs of their own, here.

The jobs are submitted as an operator would, ``retry-scheduler bulk-retry|compact --master
spark://...``, in client mode. Their executors run in processes the worker starts, with a Python that
has none of the jobs' packages (the machine's base interpreter, not this virtual environment): what
they import comes from the archive the submission ships (``--archives``), the JDBC driver by
``--jars``. Run alone with ``pytest -m cluster``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psycopg
import pyarrow.dataset as ds
import pytest

from retry_scheduler.dev.spark_cluster import SparkCluster
from tests.conftest import BASE_PYTHON
from tests.kafkautil import consume, create_topics

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

JOBS = 50_000


def seed_dead_jobs(database_url: str, destination: str, count: int) -> None:
    """``count`` dead jobs for ``destination``, on their DLQ topic for an hour (as a long outage leaves them)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO retry_jobs (source_topic, source_partition, source_offset, source_timestamp_ms,"
            " destination, msg_key, msg_value, attempt, policy, reason, error_class, retry_id,"
            " original_topic, first_seen_at, due_at, status, dead_reason, dlq_topic, dead_at, dlq_published_at)"
            " SELECT 'retry', 0, g, 1, %s, ('k' || g)::bytea, ('job-' || g)::bytea, 3, 'default', 'boom',"
            " 'app.TimeoutError', 'rid-' || g, %s, now() - interval '2 hours', now() - interval '2 hours',"
            " 'dead', 'exhausted', 'retry.dlq', now() - interval '1 hour', now() - interval '1 hour'"
            " FROM generate_series(1, %s) AS g",
            (destination, destination, count),
        )


def cli(env: dict[str, str], *args: str) -> dict:
    """``retry-scheduler ARGS`` as a subprocess; its JSON result (the job's last line on stdout)."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "retry-scheduler"), *args, "--json"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def executors_of(cluster: SparkCluster) -> dict[str, list[dict]]:
    """The executors each worker ran, by application id (from the workers' JSON status)."""
    apps: dict[str, list[dict]] = {}
    for worker in cluster.status()["workers"]:
        with urllib.request.urlopen(f"{worker['webuiaddress']}/json/", timeout=5) as answer:
            status = json.load(answer)
        for executor in status.get("executors", []) + status.get("finishedexecutors", []):
            apps.setdefault(executor["appid"], []).append(executor)
    return apps


def completed_apps(
    cluster: SparkCluster, at_least: int, since: frozenset[str] = frozenset()
) -> dict[str, str]:
    """The master's completed applications (id -> name) not in ``since``, once there are ``at_least``."""
    deadline = time.monotonic() + 30
    while True:
        apps = {a["id"]: a["name"] for a in cluster.status()["completedapps"] if a["id"] not in since}
        if len(apps) >= at_least or time.monotonic() > deadline:
            return apps
        time.sleep(0.5)


def test_the_executors_python_lacks_the_jobs_packages() -> None:
    """Else the next test could pass by the executors finding this environment's packages by accident."""
    probe = subprocess.run([BASE_PYTHON, "-c", "import confluent_kafka"], capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'confluent_kafka'" in probe.stderr


def test_bulk_retry_and_compaction_of_50_000_jobs_run_on_the_cluster(
    spark_cluster: SparkCluster, database_url: str, bootstrap_servers: str, topic_prefix: str, tmp_path: Path
) -> None:
    cluster = spark_cluster
    before = frozenset(app["id"] for app in cluster.status()["completedapps"])
    destination = f"{topic_prefix}-orders"
    create_topics(bootstrap_servers, [destination], partitions=3)
    seed_dead_jobs(database_url, destination, JOBS)
    env = {
        **os.environ,
        "RETRY_DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers,
        "RETRY_SPARK_EXECUTOR_PYTHON": BASE_PYTHON,
        "RETRY_DEV_HOME": str(tmp_path / "dev"),  # the executors' archive is packed here
    }
    env.pop("PYTHONPATH", None)

    bulk = cli(env, "bulk-retry", "--destination", destination, "--master", cluster.url)
    assert (bulk["selected"], bulk["published"], bulk["failed"]) == (JOBS, JOBS, 0)
    arrived = consume(bootstrap_servers, [destination], JOBS, timeout_s=180)
    assert sorted(int(s.value[4:]) for s in arrived if s.value) == list(range(1, JOBS + 1))
    assert {s.header("retry.id") for s in arrived} == {f"rid-{i}" for i in range(1, JOBS + 1)}

    archive = tmp_path / "archive"
    compact = cli(
        env, "compact", "--older-than", "0s", "--archive", archive.as_uri(), "--master", cluster.url
    )
    assert (compact["selected"], compact["archived_new"], compact["deleted"]) == (JOBS, JOBS, JOBS)
    archived = ds.dataset(archive / "retry_jobs", format="parquet", partitioning="hive").to_table(
        columns=["id", "msg_value", "status"]
    )
    assert archived.num_rows == JOBS
    assert sorted(int(v[4:]) for v in archived.column("msg_value").to_pylist()) == list(range(1, JOBS + 1))
    assert set(archived.column("status").to_pylist()) == {"published"}
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM retry_jobs_all").fetchone() == (0,)

    # Both ran as applications of the master, with executors on the worker (not in the driver's JVM).
    apps = completed_apps(cluster, 2, since=before)
    assert sorted(apps.values()) == ["retry-compaction", "retry_bulk_retry"], apps
    executors = executors_of(cluster)
    assert set(apps) <= set(executors), (apps, executors)
