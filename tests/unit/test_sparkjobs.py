from __future__ import annotations

import os
from pathlib import Path

import pytest

from retry_scheduler.core.config import dev_home
from retry_scheduler.db.selection import SelectionError
from retry_scheduler.spark.class_archive import class_archive
from retry_scheduler.spark.jdbc import JobArgumentError
from retry_scheduler.spark.submit import bulk_retry_args, compact_args, spark_conf


def test_bulk_retry_args_from_a_full_form() -> None:
    args = bulk_retry_args(
        {"destination": "payments", "status": "dead", "error_class": "*Timeout*", "since": "2026-11-20T10:00:00Z",
         "until": "2026-11-20T14:00:00+00:00", "limit": 500, "dry_run": False},
    )  # fmt: skip
    # No connection among them: the job reads those from its connection file.
    assert args == [
        "--destination", "payments", "--status", "dead", "--error-class", "*Timeout*",
        "--since", "2026-11-20T10:00:00+00:00", "--until", "2026-11-20T14:00:00+00:00", "--limit", "500",
    ]  # fmt: skip


def test_bulk_retry_is_a_dry_run_unless_told_otherwise() -> None:
    assert bulk_retry_args({})[-3:] == ["--status", "dead", "--dry-run"]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"destination": "bad topic"}, "not a valid topic name"),
        ({"status": "published"}, "must be dead or pending"),
        ({"since": "yesterday"}, "since='yesterday' is neither an ISO-8601 time"),
        ({"since": "2026-11-21T00:00:00Z", "until": "2026-11-20T00:00:00Z"}, "must be before until"),
        ({"limit": -5}, "limit must be a whole number from 1 to 10,000,000"),
        ({"written_by": "connect"}, "written_by needs the deployment's settings"),
        ({"mark_batch": 0}, "mark_batch 0 must be between 1 and 1000000"),
    ],
)
def test_bulk_retry_rejects_bad_forms(params: dict, message: str) -> None:
    # the form's selection is refused as the DLQ's is (SelectionError), the job's own options so too
    with pytest.raises((SelectionError, JobArgumentError), match=message):
        bulk_retry_args(params)


def test_compact_args_for_a_day_and_for_an_age() -> None:
    assert compact_args(day="2026-11-20", archive="s3a://b/a") == [
        "--archive", "s3a://b/a", "--day", "2026-11-20", "--dead-retention", "30d",
    ]  # fmt: skip
    assert "--older-than" in compact_args(older_than="0s", archive="/tmp/a", dry_run=True)


def test_batch_sizes_reach_the_jobs_only_when_asked() -> None:
    assert bulk_retry_args({"mark_batch": 50, "dry_run": False})[-2:] == ["--mark-batch", "50"]
    assert "--mark-batch" not in bulk_retry_args({"dry_run": False})
    assert compact_args(older_than="7d", archive="/tmp/a", delete_batch=100)[-2:] == ["--delete-batch", "100"]
    assert "--delete-batch" not in compact_args(older_than="7d", archive="/tmp/a")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of"),
        ({"day": "2026-11-20", "older_than": "7d"}, "exactly one of"),
        ({"day": "20/11/2026"}, "must look like"),
        ({"older_than": "a week"}, "older_than"),
        ({"older_than": "7d", "dead_retention": "forever"}, "dead_retention"),
        ({"older_than": "7d", "delete_batch": 0}, "delete_batch 0 must be positive"),
    ],
)
def test_compact_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(JobArgumentError, match=message):
        compact_args(archive="/tmp/a", **kwargs)


def test_postgres_url_from_connection_fields() -> None:
    from retry_scheduler.airflow.hook import postgres_url

    assert (
        postgres_url("db", 5432, "svc", "p@ss/word", "retry")
        == "postgresql://svc:p%40ss%2Fword@db:5432/retry"
    )
    assert postgres_url("127.0.0.1", 5432, None, None, None) == "postgresql://127.0.0.1:5432/retry_scheduler"
    # a primary and its replicas in the host field: each gets the port unless it gives its own
    assert (
        postgres_url(
            "pg-a, pg-b:5433,::1,[::2]:5434",
            6432,
            "svc",
            None,
            "retry",
            {"target_session_attrs": "read-write"},
        )
        == "postgresql://svc@pg-a:6432,pg-b:5433,[::1]:6432,[::2]:5434/retry?target_session_attrs=read-write"
    )


def test_class_archive_is_named_by_the_java_binary_and_can_be_turned_off(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("")
    monkeypatch.delenv("RETRY_SPARK_CLASS_ARCHIVE", raising=False)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    first = class_archive()
    assert first is not None and first.parent == dev_home() / "spark" and first.suffix == ".jsa"
    os.utime(java, ns=(0, 10**18))  # another JDK build at the same path: another archive
    assert class_archive() not in (None, first)

    monkeypatch.setenv("RETRY_SPARK_CLASS_ARCHIVE", str(tmp_path / "mine.jsa"))
    assert class_archive() == tmp_path / "mine.jsa"
    monkeypatch.setenv("RETRY_SPARK_CLASS_ARCHIVE", "off")
    assert class_archive() is None
    assert spark_conf() == {}


def test_spark_conf_maps_the_archive_only_when_it_is_whole(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    archive = tmp_path / "driver.jsa"
    monkeypatch.setenv("RETRY_SPARK_CLASS_ARCHIVE", str(archive))
    assert spark_conf() == {}  # a missing file would turn off the JDK's own class sharing too
    archive.write_bytes(b"archive")
    assert spark_conf() == {}  # no note of its size: not written by `dev spark-archive`
    (tmp_path / "driver.json").write_text('{"bytes": 7}')
    assert spark_conf() == {"spark.driver.defaultJavaOptions": f"-XX:SharedArchiveFile={archive}"}

    archive.write_bytes(b"arch")  # truncated: a JVM mapping it would die of SIGBUS
    assert spark_conf() == {}
    assert "has 4 bytes, 7 expected: not used; run `retry-scheduler dev spark-archive --force`" in caplog.text
    (tmp_path / "driver.json").write_text("[4]")  # not a note this project writes
    assert spark_conf() == {}
