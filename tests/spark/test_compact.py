"""The compaction job (retry_scheduler.spark.compaction, the job include/spark/compact.py): pure transforms on small frames, then whole runs
against a fresh PostgreSQL database and a local Parquet archive."""

from __future__ import annotations

import functools
import itertools
import json
import operator
import re
import time
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest
from psycopg.rows import dict_row
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import BinaryType, LongType, StringType, TimestampType
from pyspark.testing import assertDataFrameEqual

from bench.jobs import Job, insert_jobs
from retry_scheduler.core.config import Settings
from retry_scheduler.core.jobs import Status
from retry_scheduler.db.compaction import ArchiveVerificationError
from retry_scheduler.db.store import Store
from retry_scheduler.spark import archive_io
from retry_scheduler.spark import compaction as compact
from retry_scheduler.spark.connection_file import connection_file
from retry_scheduler.spark.jdbc import JobArgumentError, fetch_rows
from tests.jobrows import publish

pytestmark = pytest.mark.spark

DAY_MS = 86_400_000


# --- pure transforms and helpers (no database) -----------------------------------------------------


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def test_partition_columns_use_the_utc_day_of_the_processed_time(spark: SparkSession) -> None:
    schema = "id long, destination string, status string, published_at timestamp, dead_at timestamp"
    jobs = spark.createDataFrame(
        [
            (1, "orders", "published", utc(2025, 3, 1, 23, 59, 59, 999_999), None),
            (2, None, "dead", None, utc(2025, 3, 2, 0, 0, 0)),
            # replayed after it died: processed when published, not when it died
            (3, "payments", "published", utc(2025, 3, 5, 0, 30), utc(2025, 3, 1, 12, 0)),
        ],
        schema,
    )
    expected = spark.createDataFrame(
        [
            (1, "orders", "published", utc(2025, 3, 1, 23, 59, 59, 999_999), None, "2025-03-01"),
            (2, "__none__", "dead", None, utc(2025, 3, 2, 0, 0, 0), "2025-03-02"),
            (3, "payments", "published", utc(2025, 3, 5, 0, 30), utc(2025, 3, 1, 12, 0), "2025-03-05"),
        ],
        schema + ", day string",
    )
    previous = spark.conf.get("spark.sql.session.timeZone")
    assert previous is not None
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")  # the UTC day whatever the session's
    try:
        assertDataFrameEqual(compact.with_partition_columns(jobs), expected)
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)


def test_only_rows_missing_from_the_archive_are_written(spark: SparkSession) -> None:
    selection = spark.createDataFrame(
        [
            (1, b"\x00a", "2025-03-01"),
            (2, b"b", "2025-03-01"),
            (3, None, "2025-03-02"),
            (4, b"d", "2025-03-02"),
        ],
        "id long, msg_key binary, day string",
    )
    archived = spark.createDataFrame(
        [(2, "2025-03-01"), (4, "2025-03-02"), (9, "2025-03-02")], "id long, day string"
    )

    missing = compact.missing_from_archive(selection, archived)
    assertDataFrameEqual(
        missing,
        spark.createDataFrame([(1, b"\x00a", "2025-03-01"), (3, None, "2025-03-02")], selection.schema),
    )
    assert missing.columns == selection.columns
    assertDataFrameEqual(
        compact.found_in_archive(selection, archived), spark.createDataFrame([(2,), (4,)], "id long")
    )


def test_selection_window_and_its_sql() -> None:
    now = utc(2025, 3, 10, 6, 0)
    by_age = compact.selection_window(now, older_than_ms=7 * DAY_MS, day=None, dead_retention_ms=30 * DAY_MS)
    assert by_age == compact.Window(None, utc(2025, 3, 3, 6, 0), None, utc(2025, 2, 8, 6, 0))
    assert by_age.predicate().as_string(None) == (
        "(status = 'published' AND \"published_at\" < '2025-03-03 06:00:00+00:00'::timestamptz)"
        " OR (status = 'dead' AND dlq_published_at IS NOT NULL AND \"dead_at\" < '2025-02-08 06:00:00+00:00'::timestamptz)"
    )
    # --day: published within the UTC day, or before it on a day whose run had started (a late mark);
    # dead ones whose retention ended by the day's end
    by_day = compact.selection_window(
        now, older_than_ms=None, day=date(2025, 3, 2), dead_retention_ms=8 * DAY_MS
    )
    assert by_day == compact.Window(utc(2025, 3, 2), utc(2025, 3, 3), None, utc(2025, 2, 23), late_marks=True)
    assert by_day.predicate().as_string(None) == (
        "(status = 'published' AND (\"published_at\" >= '2025-03-02 00:00:00+00:00'::timestamptz"
        " AND \"published_at\" < '2025-03-03 00:00:00+00:00'::timestamptz"
        " OR \"published_at\" < '2025-03-02 00:00:00+00:00'::timestamptz"
        " AND (published_at AT TIME ZONE 'UTC')::date IN (SELECT day FROM retry_compaction_days)))"
        " OR (status = 'dead' AND dlq_published_at IS NOT NULL"
        " AND \"dead_at\" < '2025-02-23 00:00:00+00:00'::timestamptz)"
    )
    # the days run one after the other take every dead job once: day D takes [.., D + 1 - retention)
    nxt = compact.selection_window(
        now, older_than_ms=None, day=date(2025, 3, 3), dead_retention_ms=8 * DAY_MS
    )
    assert nxt.dead_before == by_day.dead_before + timedelta(days=1)
    # a day not over yet never takes a dead job before its retention ended
    today = compact.selection_window(now, older_than_ms=None, day=date(2025, 3, 10), dead_retention_ms=DAY_MS)
    assert today.dead_before == utc(2025, 3, 9, 6, 0)


def test_database_url_becomes_jdbc_url_and_properties() -> None:
    # The same conversion as bulk retry (retry_scheduler.spark.submit.jdbc_target): libpq parameters
    # become JDBC properties, the port is explicit.
    jdbc = compact.jdbc_target("postgresql://svc:p%40ss@db.example:6543/retry?sslmode=require")
    assert jdbc.url == "jdbc:postgresql://db.example:6543/retry"
    assert jdbc.connection_properties() == {
        "driver": "org.postgresql.Driver",
        "user": "svc",
        "password": "p@ss",
        "sslmode": "require",
        "prepareThreshold": "-1",  # binary rows
        "options": "-c statement_timeout=300000",  # RETRY_STATEMENT_TIMEOUT_MS's default
    }
    assert compact.jdbc_target("postgres://svc@[::1]/x").url == "jdbc:postgresql://[::1]:5432/x"
    with pytest.raises(JobArgumentError, match="postgresql://"):
        compact.jdbc_target("mysql://h/db")


def test_archive_paths_are_local_unless_a_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert compact.archive_uri("arch/") == f"file://{tmp_path.resolve()}/arch"
    assert compact.archive_uri("s3a://bucket/retry/") == "s3a://bucket/retry"
    assert compact.archive_uri("file:///data/a") == "file:///data/a"


@pytest.mark.parametrize(
    "argv",
    [
        ["--day", "2025-02-30"],
        ["--day", "20250201"],
        ["--older-than", "7x"],
        ["--older-than", "1d", "--day", "2025-02-01"],
        ["--delete-batch", "0"],
        ["--delete-workers", "0"],
        ["--run-id", "x'; DROP TABLE retry_jobs; --"],
    ],
)
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        compact.parse_args(["--archive", "/a", *argv])


def test_defaults() -> None:
    args = compact.parse_args(["--archive", "/a"])
    assert (args.older_than, args.day, args.dead_retention) == (7 * DAY_MS, None, 30 * DAY_MS)
    assert (args.delete_batch, args.delete_workers, args.partitions, args.dry_run) == (50_000, 2, 8, False)


def test_manifest_goes_through_hadoop_for_uris(spark: SparkSession, tmp_path: Path) -> None:
    target = tmp_path / "m" / "run.json"
    archive_io.write_text_hadoop(spark, f"file://{target}", '{"selected": 3}\n')
    assert json.loads(target.read_text()) == {"selected": 3}


# --- whole runs on PostgreSQL ---------------------------------------------------------------------


_offsets = itertools.count(1)


def make_job(offset: int, status: Status, destination: str | None) -> Job:
    now = int(time.time() * 1000)
    return Job(
        source_topic="retry", source_partition=0, source_offset=offset, source_timestamp_ms=1,
        destination=destination, destination_partition=None if offset % 2 else 3,
        key=None if offset % 3 == 0 else b"\x00\xffkey-%d" % offset, value=bytes(range(256)) + b"%d" % offset,
        headers=(("trace", b"\x01\x02"), ("empty", None), ("trace", b"again")), attempt=offset % 4,
        policy="default", reason="boom", error_class="ValueError", consumer_group="svc", retry_id=f"id-{offset}",
        original_topic=destination, original_partition=None, original_offset=offset, original_timestamp_ms=now,
        due_ms=now - 60_000, status=status, dead_reason="exhausted" if status is Status.DEAD else None,
        dlq_topic="retry.dlq",
    )  # fmt: skip


def seed(database_url: str, jobs: dict[str, tuple[str, datetime | None, str | None]]) -> dict[str, int]:
    """Insert jobs named ``name -> (status, processed time, destination)``; returns their ids."""
    offsets = {name: next(_offsets) for name in jobs}
    with Store(database_url) as store:
        insert_jobs(
            store,  # published ones are stored pending and then published, as the loop does
            [
                make_job(offsets[name], Status.PENDING if status == "published" else Status(status), dest)
                for name, (status, _, dest) in jobs.items()
            ],
        )
    with psycopg.connect(database_url) as conn:
        by_offset: dict[int, int] = dict(
            conn.execute("SELECT source_offset, id FROM retry_jobs_all").fetchall()
        )
        ids = {name: by_offset[offset] for name, offset in offsets.items()}
        for name, (status, at, _) in jobs.items():
            if status == "published":
                assert at is not None
                publish(conn, "id = %s", (ids[name],), at=at)
            elif status == "dead":  # on its DLQ topic a moment after it died, as the publish loop does
                conn.execute(
                    "UPDATE retry_jobs SET dead_at = %s, dlq_published_at = %s WHERE id = %s",
                    (at, at + timedelta(seconds=1) if at else None, ids[name]),
                )
    return ids


def db_rows(database_url: str) -> dict[int, dict[str, Any]]:
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        rows = conn.execute("SELECT * FROM retry_jobs_all").fetchall()
    return {row["id"]: row for row in rows}


def staged(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM retry_compaction_archived").fetchone()
    assert row is not None
    return int(row[0])


def replay_from_the_dlq(database_url: str, job_id: int) -> None:
    """Someone replays a dead job while a compaction runs, on a connection of their own."""
    with psycopg.connect(database_url, autocommit=True) as other:
        other.execute("UPDATE retry_jobs SET status = 'pending', dead_reason = NULL WHERE id = %s", (job_id,))


def read_archive(spark: SparkSession, archive: Path) -> DataFrame:
    return spark.read.parquet(str(archive / "retry_jobs"))


def archived_ids(spark: SparkSession, archive: Path) -> list[int]:
    if not (archive / "retry_jobs").exists():
        return []
    return sorted(row["id"] for row in read_archive(spark, archive).select("id").collect())


def normalise(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC)  # Spark hands back naive local times
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


def run(database_url: str, archive: Path | str, *args: str) -> dict[str, Any]:
    """The job as spark-submit runs it: its connection in a private file, never on the command line."""
    with connection_file(Settings(database_url=database_url)) as path:
        return compact.main(
            ["--connection-file", str(path), "--archive", str(archive), "--partitions", "3", *args]
        )


def day_args(day: date, dead_boundary: datetime) -> list[str]:
    """``--day day`` with the dead retention that takes the dead jobs that died before ``dead_boundary``.

    The run of a day takes the dead jobs whose retention ended by the day's end.
    """
    end = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1)
    retention_ms = int((end - dead_boundary).total_seconds() * 1000)
    return ["--day", day.isoformat(), "--dead-retention", f"{retention_ms}ms"]


@pytest.mark.integration
def test_archives_processed_jobs_then_deletes_exactly_them(
    spark: SparkSession, jdbc_jar: str, database_url: str, tmp_path: Path
) -> None:
    now = datetime.now(UTC)
    ids = seed(
        database_url,
        {
            "old_published": ("published", now - timedelta(days=10), "orders"),
            "old_published_no_destination": ("published", now - timedelta(days=8), None),
            "old_dead": ("dead", now - timedelta(days=40), "payments"),
            "recent_published": ("published", now - timedelta(days=1), "orders"),
            "dead_within_retention": ("dead", now - timedelta(days=10), "orders"),
            "pending": ("pending", None, "orders"),
        },
    )
    before = db_rows(database_url)
    archive = tmp_path / "archive"

    result = run(
        database_url, archive, "--older-than", "7d", "--dead-retention", "30d", "--delete-batch", "1"
    )

    gone = {ids["old_published"], ids["old_published_no_destination"], ids["old_dead"]}
    day_of = {
        i: (before[i]["published_at"] or before[i]["dead_at"]).astimezone(UTC).date().isoformat()
        for i in gone
    }
    assert result["selected"] == result["archived_new"] == result["deleted"] == 3
    assert result["already_archived"] == 0
    assert result["days"] == sorted(set(day_of.values()))
    assert set(db_rows(database_url)) == set(before) - gone
    assert staged(database_url) == 0

    frame = read_archive(spark, archive)
    types = {field.name: field.dataType for field in frame.schema.fields}
    assert (types["msg_key"], types["msg_value"], types["headers"]) == (BinaryType(),) * 3
    assert (types["published_at"], types["dead_at"], types["due_at"]) == (TimestampType(),) * 3
    assert (types["id"], types["status"]) == (LongType(), StringType())
    archived = {row["id"]: row.asDict() for row in frame.collect()}
    assert set(archived) == gone
    for job_id, row in archived.items():
        expected = {column: normalise(value) for column, value in before[job_id].items()}
        expected["destination"] = expected["destination"] or "__none__"
        got = {column: normalise(value) for column, value in row.items() if column != "day"}
        assert got == expected, job_id
        assert str(row["day"]) == day_of[job_id]
    assert bytes(archived[ids["old_published"]]["msg_value"]) == before[ids["old_published"]]["msg_value"]
    assert before[ids["old_published"]]["msg_value"].startswith(bytes(range(256)))
    none_dir = (
        archive / "retry_jobs" / f"day={day_of[ids['old_published_no_destination']]}" / "destination=__none__"
    )
    assert list(none_dir.glob("*.parquet"))


@pytest.mark.integration
def test_the_same_day_twice_archives_nothing_twice(
    spark: SparkSession, jdbc_jar: str, database_url: str, tmp_path: Path
) -> None:
    now = datetime.now(UTC)
    day = (now - timedelta(days=10)).date()
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    ids = seed(
        database_url,
        {
            "first_instant": ("published", start, "orders"),
            "last_instant": ("published", start + timedelta(days=1, microseconds=-1), "payments"),
            "day_before": ("published", start - timedelta(microseconds=1), "orders"),
            "day_after": ("published", start + timedelta(days=1), "orders"),
            "dead_past_retention": ("dead", start + timedelta(hours=6), "orders"),
            "dead_within_retention": ("dead", start + timedelta(hours=18), "orders"),
            "pending": ("pending", None, "orders"),
        },
    )
    archive = tmp_path / "archive"
    argv = day_args(day, dead_boundary=start + timedelta(hours=12))
    day_ids = sorted([ids["first_instant"], ids["last_instant"], ids["dead_past_retention"]])

    dry = run(database_url, archive, *argv, "--dry-run")
    assert (dry["selected"], dry["archived_new"], dry["deleted"], dry["manifest"]) == (3, 3, 0, None)
    assert len(db_rows(database_url)) == 7 and not archive.exists()
    assert staged(database_url) == 0  # a dry run stages nothing either

    first = run(database_url, archive, *argv)
    assert (first["selected"], first["archived_new"], first["deleted"]) == (3, 3, 3)
    assert first["days"] == [day.isoformat()]
    with psycopg.connect(database_url) as conn:
        [(autovacuum, vacuumed_at)] = conn.execute(
            "SELECT current_setting('autovacuum')::boolean, last_vacuum FROM pg_stat_user_tables"
            " WHERE relname = 'retry_published_jobs'"
        ).fetchall()
    # Where the server vacuums nothing, the run vacuumed the published jobs' table after its deletes.
    assert first["vacuumed"] is (not autovacuum)
    assert (vacuumed_at is not None) is (not autovacuum)
    assert archived_ids(spark, archive) == day_ids
    left = set(db_rows(database_url))

    second = run(database_url, archive, *argv)
    assert (second["selected"], second["archived_new"], second["deleted"]) == (0, 0, 0)
    assert archived_ids(spark, archive) == day_ids
    assert set(db_rows(database_url)) == left

    # a job that reached the day late is added alone
    [late] = seed(database_url, {"late": ("published", start + timedelta(hours=3), "orders")}).values()
    third = run(database_url, archive, *argv)
    assert (third["selected"], third["archived_new"], third["already_archived"], third["deleted"]) == (
        1,
        1,
        0,
        1,
    )
    assert archived_ids(spark, archive) == sorted([*day_ids, late])
    assert set(db_rows(database_url)) == left


@pytest.mark.integration
def test_a_crash_before_the_delete_is_finished_by_the_next_run(
    spark: SparkSession, jdbc_jar: str, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = datetime.now(UTC)
    day = (now - timedelta(days=3)).date()
    noon = datetime(day.year, day.month, day.day, 12, tzinfo=UTC)
    ids = seed(
        database_url,
        {"a": ("published", noon, "orders"), "b": ("published", noon, None), "other": ("pending", None, "x")},
    )
    archive = tmp_path / "archive"
    argv = [*day_args(day, dead_boundary=noon), "--run-id", "scheduled__crash"]

    def crash(*args: object, **kwargs: object) -> int:
        raise RuntimeError("driver killed")

    monkeypatch.setattr(compact, "delete_archived", crash)
    monkeypatch.setattr(compact, "clear_staging", lambda conn, run_id: None)  # died: no cleanup either
    with pytest.raises(RuntimeError, match="driver killed"):
        run(database_url, archive, *argv)
    assert set(db_rows(database_url)) == set(ids.values())
    assert archived_ids(spark, archive) == sorted([ids["a"], ids["b"]])
    assert staged(database_url) == 2

    monkeypatch.undo()
    again = run(database_url, archive, *argv)
    assert (again["selected"], again["already_archived"], again["archived_new"], again["deleted"]) == (
        2,
        2,
        0,
        2,
    )
    assert archived_ids(spark, archive) == sorted([ids["a"], ids["b"]])
    assert set(db_rows(database_url)) == {ids["other"]}
    assert staged(database_url) == 0


@pytest.mark.integration
def test_rows_missing_from_the_archive_stop_the_delete(
    spark: SparkSession, jdbc_jar: str, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = datetime.now(UTC)
    ids = seed(database_url, {f"p{i}": ("published", now - timedelta(days=9), "orders") for i in range(3)})
    archive = tmp_path / "archive"
    real_write: Callable[[DataFrame, str], None] = compact.write_archive

    def lossy_write(rows: DataFrame, root: str) -> None:
        real_write(rows.where(rows.id != ids["p1"]), root)

    monkeypatch.setattr(compact, "write_archive", lossy_write)
    with pytest.raises(compact.ArchiveVerificationError, match="1 of 3 selected jobs are not in the archive"):
        run(database_url, archive)
    assert set(db_rows(database_url)) == set(ids.values())
    assert staged(database_url) == 0
    assert not (archive / "_manifests").exists()

    monkeypatch.undo()
    again = run(database_url, archive)
    assert (again["selected"], again["already_archived"], again["archived_new"], again["deleted"]) == (
        3,
        2,
        1,
        3,
    )
    assert archived_ids(spark, archive) == sorted(ids.values())
    assert db_rows(database_url) == {}


@pytest.mark.integration
def test_a_delete_failing_on_one_of_its_connections_is_raised_and_the_next_run_finishes(
    spark: SparkSession, jdbc_jar: str, database_url: str, tmp_path: Path
) -> None:
    now = datetime.now(UTC)
    ids = seed(database_url, {f"p{i}": ("published", now - timedelta(days=9), "orders") for i in range(12)})
    archive = tmp_path / "archive"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE EXCEPTION 'disk full (test)'; END $$"
        )
        conn.execute(
            "CREATE TRIGGER refuse_delete BEFORE DELETE ON retry_published_jobs FOR EACH ROW"
            f" WHEN (OLD.id = {ids['p5']}) EXECUTE FUNCTION refuse_delete()"
        )
    with pytest.raises(psycopg.errors.RaiseException, match="disk full"):
        run(database_url, archive, "--delete-batch", "1", "--delete-workers", "3")
    left = set(db_rows(database_url))
    assert ids["p5"] in left and left <= set(ids.values())
    assert archived_ids(spark, archive) == sorted(ids.values())  # archived before the delete began
    assert staged(database_url) == 0

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DROP TRIGGER refuse_delete ON retry_published_jobs")
        conn.execute("DROP FUNCTION refuse_delete()")
    again = run(database_url, archive, "--delete-batch", "1", "--delete-workers", "3")
    assert (again["selected"], again["already_archived"], again["archived_new"], again["deleted"]) == (
        len(left), len(left), 0, len(left),
    )  # fmt: skip
    assert db_rows(database_url) == {}
    assert archived_ids(spark, archive) == sorted(ids.values())  # nothing archived twice


@pytest.mark.integration
def test_each_run_leaves_a_manifest_with_its_counts(
    spark: SparkSession, jdbc_jar: str, database_url: str, tmp_path: Path
) -> None:
    now = datetime.now(UTC)
    ids = seed(
        database_url,
        {
            "p": ("published", now - timedelta(days=8), "orders"),
            "d": ("dead", now - timedelta(days=31), "orders"),
        },
    )
    archive = tmp_path / "archive"
    run_id = "scheduled__2025-01-01T00:00:00+00:00"

    result = run(database_url, f"file://{archive}", "--run-id", run_id)

    manifest_path = archive / "_manifests" / "scheduled__2025-01-01T00_00_00_00_00.json"
    assert result["manifest"] == f"file://{manifest_path}"
    manifest = json.loads(manifest_path.read_text())
    assert manifest == {key: value for key, value in result.items() if key != "manifest"}
    assert manifest["run_id"] == run_id
    assert (manifest["selected"], manifest["archived_new"], manifest["already_archived"], manifest["deleted"]) == (
        2, 2, 0, 2,
    )  # fmt: skip
    assert manifest["day"] is None
    assert datetime.fromisoformat(manifest["cutoff"]) < now - timedelta(days=7) + timedelta(minutes=5)
    assert manifest["started_at"] <= manifest["finished_at"]
    assert sorted(manifest["days"]) == manifest["days"] and len(manifest["days"]) == 2
    assert archived_ids(spark, archive) == sorted(ids.values())
    # Each file written, with its rows and a checksum of its ids, read back from the archive.
    files = manifest["files"]
    assert sum(f["rows"] for f in files) == 2
    assert sum(f["id_sum"] for f in files) == sum(ids.values())
    for digest in files:
        assert digest["file"].startswith("day="), digest  # relative to the archive's retry_jobs/
        in_file = (
            pq.read_table(archive / "retry_jobs" / digest["file"], columns=["id"]).column("id").to_pylist()
        )
        assert (len(in_file), sum(in_file), functools.reduce(operator.xor, in_file)) == (
            digest["rows"], digest["id_sum"], digest["id_xor"],
        )  # fmt: skip


@pytest.mark.integration
def test_a_written_row_the_run_did_not_stage_stops_the_delete(
    spark: SparkSession, jdbc_jar: str, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = datetime.now(UTC)
    ids = seed(database_url, {f"p{i}": ("published", now - timedelta(days=9), "orders") for i in range(3)})
    archive = tmp_path / "archive"
    real_write: Callable[[DataFrame, str], None] = compact.write_archive

    def write_with_a_stranger(rows: DataFrame, root: str) -> None:
        stranger = rows.where(rows.id == ids["p0"]).withColumn("id", rows.id + 1000)
        real_write(rows.unionByName(stranger), root)

    monkeypatch.setattr(compact, "write_archive", write_with_a_stranger)
    with pytest.raises(
        compact.ArchiveVerificationError, match="hold 1 rows it did not stage and 0 ids already"
    ):
        run(database_url, archive)
    assert set(db_rows(database_url)) == set(ids.values())  # nothing deleted
    assert not (archive / "_manifests").exists()


@pytest.mark.integration
def test_daily_runs_archive_each_dead_job_once_its_retention_ended_and_never_one_not_on_the_dlq(
    spark: SparkSession, jdbc_jar: str, database_url: str, tmp_path: Path
) -> None:
    now = datetime.now(UTC)
    today = now.date()
    days = [today - timedelta(days=n) for n in (3, 2, 1)]  # three daily runs, oldest first
    retention = timedelta(days=30)
    start = {d: datetime(d.year, d.month, d.day, tzinfo=UTC) for d in days}
    ids = seed(
        database_url,
        {
            # retention ended long before the first of these days: the first run takes it
            "long_past": ("dead", start[days[0]] - retention - timedelta(days=5), "orders"),
            # retention ends within each day: that day's run takes it
            **{
                f"ends_day{n}": ("dead", start[d] - retention + timedelta(hours=6), "orders")
                for n, d in enumerate(days)
            },
            # retention not over by the last day's end
            "recent": ("dead", now - timedelta(days=2), "orders"),
            "not_on_dlq": ("dead", start[days[0]] - retention - timedelta(days=5), "payments"),
            "published_day1": ("published", start[days[1]] + timedelta(hours=1), "orders"),
        },
    )
    with psycopg.connect(database_url) as conn:  # still on its way to the DLQ topic: its only copy is here
        conn.execute("UPDATE retry_jobs SET dlq_published_at = NULL WHERE id = %s", (ids["not_on_dlq"],))
    archive = tmp_path / "archive"
    taken = []
    for day in days:
        result = run(database_url, archive, "--day", day.isoformat(), "--dead-retention", "30d")
        taken.append(result["deleted"])
        assert result["files_synced"] > 0  # the local archive was fsynced before the delete
    assert taken == [2, 2, 1]  # long_past + ends_day0; ends_day1 + published_day1; ends_day2
    assert set(db_rows(database_url)) == {ids["recent"], ids["not_on_dlq"]}
    assert archived_ids(spark, archive) == sorted(
        ids[n] for n in ("long_past", "ends_day0", "ends_day1", "ends_day2", "published_day1")
    )
    # Running the days again finds nothing more to do.
    for day in days:
        assert (
            run(database_url, archive, "--day", day.isoformat(), "--dead-retention", "30d")["selected"] == 0
        )


@pytest.mark.integration
def test_a_dead_job_not_yet_on_its_dlq_topic_is_never_compacted(
    spark: SparkSession, jdbc_jar: str, database_url: str, tmp_path: Path
) -> None:
    now = datetime.now(UTC)
    ids = seed(database_url, {"old": ("dead", now - timedelta(days=90), "orders")})
    with psycopg.connect(database_url) as conn:
        conn.execute("UPDATE retry_jobs SET dlq_published_at = NULL")
    result = run(database_url, tmp_path / "archive", "--older-than", "0s", "--dead-retention", "0s")
    assert (result["selected"], result["deleted"]) == (0, 0)
    assert set(db_rows(database_url)) == {ids["old"]}


@pytest.mark.integration
def test_a_job_replayed_after_it_was_archived_is_not_deleted(
    spark: SparkSession, jdbc_jar: str, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = datetime.now(UTC)
    ids = seed(
        database_url,
        {
            "dead": ("dead", now - timedelta(days=40), "orders"),
            "published": ("published", now - timedelta(days=9), "x"),
        },
    )
    real_delete = compact.delete_archived

    def replay_then_delete(*args: Any, **kwargs: Any) -> int:
        replay_from_the_dlq(database_url, ids["dead"])  # archived and verified, not deleted yet
        return real_delete(*args, **kwargs)

    monkeypatch.setattr(compact, "delete_archived", replay_then_delete)
    result = run(database_url, tmp_path / "archive")
    assert (result["selected"], result["archived_new"], result["deleted"]) == (2, 2, 1)
    assert set(db_rows(database_url)) == {ids["dead"]}
    assert staged(database_url) == 0


@pytest.mark.integration
def test_large_records_are_read_a_few_rows_per_round_trip_and_archived_whole(
    spark: SparkSession, jdbc_jar: str, database_url: str, tmp_path: Path
) -> None:
    now = datetime.now(UTC)
    ids = seed(database_url, {f"big{i}": ("published", now - timedelta(days=8), "orders") for i in range(3)})
    big = bytes(range(256)) * 3500  # 896 000 bytes, near the 1 MiB record limit
    with psycopg.connect(database_url) as conn:
        conn.execute("UPDATE retry_published_jobs SET msg_value = %s", (big,))
    before = db_rows(database_url)
    largest = max(
        len(r["msg_key"] or b"") + len(r["msg_value"]) + len(r["headers"] or b"") for r in before.values()
    )

    result = run(database_url, tmp_path / "archive", "--older-than", "7d")

    # 64 MiB per round trip: 74 rows of this size, not the 10 000 that small rows get.
    assert result["fetch_rows"] == fetch_rows(largest) == 64 * 2**20 // (512 + largest)
    assert result["selected"] == result["archived_new"] == result["deleted"] == 3
    archived = {
        row["id"]: bytes(row["msg_value"]) for row in read_archive(spark, tmp_path / "archive").collect()
    }
    assert archived == {i: big for i in ids.values()}


@pytest.mark.integration
def test_jobs_leaving_or_joining_the_selection_during_the_run_are_kept(
    spark: SparkSession, jdbc_jar: str, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = datetime.now(UTC)
    ids = seed(
        database_url,
        {
            "kept_dead": ("dead", now - timedelta(days=40), "orders"),
            "archived": ("published", now - timedelta(days=9), "orders"),
            "late": ("pending", None, "orders"),
        },
    )
    archive = tmp_path / "archive"
    real_write: Callable[[DataFrame, str], None] = compact.write_archive

    def write_while_others_work(rows: DataFrame, root: str) -> None:
        replay_from_the_dlq(database_url, ids["kept_dead"])  # after the run counted it: leaves the selection
        real_write(rows, root)
        with psycopg.connect(database_url, autocommit=True) as other:
            # marked published with an acknowledgement time inside the window: joins it
            publish(other, "id = %s", (ids["late"],), at=now - timedelta(days=9))

    monkeypatch.setattr(compact, "write_archive", write_while_others_work)
    result = run(database_url, archive, "--older-than", "7d", "--dead-retention", "30d")

    assert (result["selected"], result["deleted"]) == (2, 1)
    assert archived_ids(spark, archive) == [ids["archived"]]
    assert set(db_rows(database_url)) == {ids["kept_dead"], ids["late"]}
    assert staged(database_url) == 0

    monkeypatch.undo()
    again = run(database_url, archive, "--older-than", "7d", "--dead-retention", "30d")
    assert (again["selected"], again["archived_new"], again["deleted"]) == (1, 1, 1)
    assert set(db_rows(database_url)) == {ids["kept_dead"]}


@pytest.mark.integration
def test_a_connection_with_libpq_options_runs_the_compaction(
    spark: SparkSession, jdbc_jar: str, database_url: str, tmp_path: Path
) -> None:
    """Once refused ("no JDBC equivalent"): the README recommends ``options`` on the retry_postgres connection."""
    now = datetime.now(UTC)
    ids = seed(
        database_url,
        {"old": ("published", now - timedelta(days=10), "orders"), "pending": ("pending", None, "orders")},
    )
    url = f"{database_url}?options=-c%20lock_timeout%3D4000&target_session_attrs=read-write&keepalives=1"

    result = run(url, tmp_path / "archive", "--older-than", "7d")

    assert result["selected"] == result["archived_new"] == result["deleted"] == 1
    assert set(db_rows(database_url)) == {ids["pending"]}
    assert {row["id"] for row in read_archive(spark, tmp_path / "archive").collect()} == {ids["old"]}


@pytest.mark.integration
def test_a_job_marked_published_after_its_day_s_run_started_is_taken_by_the_next_run(
    spark: SparkSession, jdbc_jar: str, database_url: str, tmp_path: Path
) -> None:
    """Its acknowledgement time falls in a day whose run had already selected (a late mark, a bulk
    replay's batch): once, no later daily run took it, and it stayed in PostgreSQL for ever."""
    today = datetime.now(UTC).date()
    day1, day2 = today - timedelta(days=2), today - timedelta(days=1)
    noon1 = datetime(day1.year, day1.month, day1.day, 12, tzinfo=UTC)
    archive = tmp_path / "archive"
    ids = seed(database_url, {"on_time": ("published", noon1, "orders")})
    assert run(database_url, archive, "--day", day1.isoformat())["deleted"] == 1

    late = seed(database_url, {"late": ("published", noon1 + timedelta(hours=11), "orders")})  # marked now
    result = run(database_url, archive, "--day", day2.isoformat())

    assert (result["selected"], result["deleted"]) == (1, 1)
    assert db_rows(database_url) == {}
    assert archived_ids(spark, archive) == sorted([ids["on_time"], late["late"]])
    # archived under its own day, beside the first run's files
    assert result["days"] == [day1.isoformat()]


@pytest.mark.integration
def test_a_file_changed_since_its_manifest_was_written_stops_the_delete(
    spark: SparkSession, jdbc_jar: str, database_url: str, tmp_path: Path
) -> None:
    """The per-file rows and id checksum a manifest records are compared on every later verification of
    the same day: a file rewritten with a row less (or gone) stops the run before anything is deleted."""
    day = (datetime.now(UTC) - timedelta(days=3)).date()
    noon = datetime(day.year, day.month, day.day, 12, tzinfo=UTC)
    archive = tmp_path / "archive"
    seed(database_url, {f"job{n}": ("published", noon + timedelta(minutes=n), "orders") for n in range(3)})
    first = run(database_url, archive, "--day", day.isoformat())
    assert first["deleted"] == 3 and first["files_compared"] == len(first["files"]) >= 1
    manifest = json.loads(Path(first["manifest"].removeprefix("file://")).read_text())
    assert manifest["files"] == first["files"]

    # A job of the same day marked late: the next run compares the first run's files too, and goes on.
    seed(database_url, {"late0": ("published", noon + timedelta(hours=4), "orders")})
    again = run(database_url, archive, "--day", day.isoformat())
    assert again["deleted"] == 1
    assert again["files_compared"] == len(first["files"]) + len(again["files"])

    # One archived row lost (a file rewritten by hand, a broken copy): its manifest no longer agrees.
    damaged = next(d for d in first["files"] if d["rows"] > 0)
    path = archive / "retry_jobs" / damaged["file"]
    table = pq.read_table(path)
    pq.write_table(table.slice(0, table.num_rows - 1), path)
    path.with_name(f".{path.name}.crc").unlink()  # Hadoop's own checksum of the local file: rewritten too
    late = seed(database_url, {"late": ("published", noon + timedelta(hours=5), "orders")})
    with pytest.raises(ArchiveVerificationError, match=re.escape(f"{damaged['file']} (manifest ")):
        run(database_url, archive, "--day", day.isoformat())
    assert set(db_rows(database_url)) == set(late.values())  # nothing was deleted
