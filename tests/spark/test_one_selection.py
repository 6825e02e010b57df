"""One selection, every path: the same filter picks the same jobs through the DLQ operations (and
so the page and the ``dlq_replay`` form, which call them with ``Selection.from_params``), the
``dlq`` and ``bulk-retry`` command lines, the ``retry_bulk_replay`` form's job arguments and the
Spark bulk retry's JDBC read, against the same rows."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from pyspark.sql import SparkSession

from bench.jobs import Job, insert_jobs
from retry_scheduler.cli.main import main as cli
from retry_scheduler.core.config import Settings
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.jobs import Status
from retry_scheduler.db.selection import Selection
from retry_scheduler.db.store import Store
from retry_scheduler.ops import browse
from retry_scheduler.ops.dlq import Operation, run_action
from retry_scheduler.spark import bulk_options, bulk_retry
from retry_scheduler.spark.selection import read_selection, summarize
from retry_scheduler.spark.submit import bulk_retry_args

pytestmark = [pytest.mark.spark, pytest.mark.integration]

NOW = datetime.now(UTC).replace(microsecond=0)
REASONS = ("exhausted", "expired", "fatal")
CLASSES = ("net.TimeoutError", "db.Deadlock", "app.Declined")


def deployment() -> Deployment:
    """The tests' deployment (their environment), read as a front door does."""
    return Deployment.load(Settings.from_env())


def job(i: int, topic_prefix: str) -> Job:
    """Dead job ``i``: of one of two destinations, reasons, error classes and source topics."""
    now = int(time.time() * 1000)
    destination = f"{topic_prefix}.{'orders' if i % 2 else 'payments'}"
    return Job(
        source_topic="orders.DLT" if i % 5 == 0 else "retry", source_partition=0, source_offset=i,
        source_timestamp_ms=1, destination=destination, destination_partition=None, key=b"k%d" % i,
        value=b"v", headers=(), attempt=2, policy="default",
        reason=f"card declined by bank {i}" if i % 4 == 0 else f"call {i} timed out",
        error_class=CLASSES[i % 3], consumer_group="svc", retry_id=f"rid-{i}", original_topic=destination,
        original_partition=None, original_offset=None, original_timestamp_ms=now, due_ms=now,
        status=Status.DEAD, dead_reason=REASONS[i % 3], dlq_topic="retry.dlq",
    )  # fmt: skip


@pytest.fixture
def rows(database_url: str, topic_prefix: str) -> dict[str, int]:
    """40 dead jobs, job i dead i hours ago, and 5 pending ones: retry id -> job id."""
    with Store(database_url) as store:
        insert_jobs(store, [job(i, topic_prefix) for i in range(40)])
        insert_jobs(
            store,
            [replace(job(i, topic_prefix), status=Status.PENDING, dead_reason=None) for i in range(40, 45)],
        )
    with psycopg.connect(database_url) as conn:
        for i in range(40):
            conn.execute(
                "UPDATE retry_jobs SET dead_at = %s WHERE retry_id = %s",
                (NOW - timedelta(hours=i), f"rid-{i}"),
            )
        return dict(conn.execute("SELECT retry_id, id FROM retry_jobs").fetchall())


def forms(topic_prefix: str, ids: dict[str, int]) -> list[dict[str, Any]]:
    """Filters as a form, the page and the command lines give them (the same names everywhere)."""
    since, until = NOW - timedelta(hours=30, minutes=30), NOW - timedelta(hours=5, minutes=30)
    return [
        {},
        {"destination": f"{topic_prefix}.orders"},
        {"dead_reason": "expired", "error_class": "*Deadlock"},
        {"search": "DECLINED"},
        {"since": since.isoformat(), "until": until.isoformat()},
        {"destination": f"{topic_prefix}.payments", "since": since.isoformat()},
        {"written_by": "spring"},
        {"ids": ",".join(str(ids[f"rid-{i}"]) for i in (3, 4, 17, 41))},  # 41 is pending: not selected
        {"error_class": "net.*", "search": "timed out", "until": until.isoformat()},
    ]


def command_line(form: dict[str, Any]) -> list[str]:
    return [arg for name, value in form.items() for arg in (f"--{name.replace('_', '-')}", str(value))]


def test_one_filter_selects_the_same_jobs_through_every_path(
    spark: SparkSession, database_url: str, topic_prefix: str, rows: dict[str, int],
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("RETRY_DATABASE_URL", database_url)
    monkeypatch.setenv("RETRY_ADOPT_TOPICS", "orders.DLT=spring")
    settings = Settings.from_env()
    jdbc = bulk_retry.jdbc_target(database_url)
    for form in forms(topic_prefix, rows):
        selection = Selection.from_params(form, settings)  # the page's, the dlq_replay form's

        # The DLQ operations (the page's list, the form's dry run).
        listed = {j.id for j in browse.list_dead(database_url, selection, page_size=500).jobs}
        counted = run_action(
            database_url,
            Operation(action="replay", selection=selection, actor="t", source="cli", dry_run=True),
            deployment=deployment(),
        )
        assert counted.matched == len(listed), form

        # `retry-scheduler dlq list`: its own parser, the same names.
        assert cli(["dlq", "list", "--json", "--page-size", "500", *command_line(form)]) == 0
        assert {j["id"] for j in json.loads(capsys.readouterr().out)["jobs"]} == listed, form

        # The retry_bulk_replay form's arguments, read back by the Spark job's own parser ...
        job_args = bulk_retry_args({**form, "dry_run": False}, settings)
        assert bulk_options.parse_args(["--bootstrap-servers", "b:9092", *job_args]).selection == selection
        # ... and `retry-scheduler bulk-retry`'s options, by the same parser.
        options = bulk_options.parse_args(["--bootstrap-servers", "b:9092", *command_line(form)])
        assert options.selection == selection, form

        # What the Spark job reads over JDBC: the same jobs.
        summary = summarize(database_url, selection)
        assert summary.count == len(listed), form
        if listed:
            read = read_selection(spark, jdbc, selection, summary, partitions=3, fetchsize=100)
            assert {r["id"] for r in read.select("id").collect()} == listed, form

    # The filters are not idle: they choose different, non-empty sets.
    chosen = [
        frozenset(j.id for j in browse.list_dead(database_url, Selection.from_params(f, settings), page_size=500).jobs)
        for f in forms(topic_prefix, rows)
    ]  # fmt: skip
    assert all(chosen) and len(set(chosen)) == len(chosen)
    assert len(chosen[0]) == 40 and rows["rid-41"] not in chosen[7] and len(chosen[7]) == 3


def test_a_limit_takes_the_oldest_jobs_on_every_path(
    spark: SparkSession, database_url: str, rows: dict[str, int], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("RETRY_DATABASE_URL", database_url)
    selection = Selection.from_params({"dead_reason": "fatal", "limit": "4"})
    oldest = sorted(i for rid, i in rows.items() if int(rid[4:]) < 40 and int(rid[4:]) % 3 == 2)[:4]
    counted = run_action(
        database_url,
        Operation(action="replay", selection=selection, actor="t", source="cli", dry_run=True),
        deployment=deployment(),
    )
    summary = summarize(database_url, selection)
    read = read_selection(spark, bulk_retry.jdbc_target(database_url), selection, summary, 2, 100)
    assert counted.matched == summary.count == 4
    assert sorted(r["id"] for r in read.select("id").collect()) == oldest
