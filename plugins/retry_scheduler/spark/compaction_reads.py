"""Compaction's reads over JDBC (the window a run takes, the ids it staged) and its archive's layout;
its PostgreSQL statements are :mod:`retry_scheduler.db.compaction`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from retry_scheduler.db.compaction import Window, staged_table, window_table
from retry_scheduler.spark.jdbc import JdbcTarget

PARTITION_COLUMNS = ("day", "destination")
NONE_DESTINATION = "__none__"
#: What the run reads back from the archive: ids, with the partition columns typed as strings.
ARCHIVED_ID_SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("day", StringType()),
        StructField("destination", StringType()),
    ]
)
MAX_DURATION_MS = 36_500 * 86_400_000
DAY_PATTERN = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# Airflow run ids ("scheduled__2025-01-01T00:00:00+00:00") are fine; the manifest name is sanitised.
RUN_ID_PATTERN = re.compile(r"^[\w.:+@-]{1,200}$")


def archive_uri(archive: str) -> str:
    """The archive as a URI: a plain path is local (``file://``), never the cluster's default file system."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/", archive):
        return archive.rstrip("/")
    return "file://" + str(Path(archive).expanduser().resolve())


def local_path(uri: str) -> Path | None:
    parts = urlsplit(uri)
    # Hadoop does not percent-decode paths either: the same string names the same file for both.
    return Path(parts.path) if parts.scheme == "file" else None


def read_window(
    spark: SparkSession,
    jdbc: JdbcTarget,
    conn: psycopg.Connection[Any],
    window: Window,
    bounds: tuple[int, int],
    partitions: int,
    fetchsize: int,
) -> DataFrame:
    """The selected jobs, read over JDBC in ``partitions`` id ranges, ``fetchsize`` rows per round trip."""
    return (
        spark.read.format("jdbc")
        .options(**jdbc.options())
        .option("dbtable", window_table(conn, window))
        .option("partitionColumn", "id")
        .option("lowerBound", str(bounds[0]))
        .option("upperBound", str(bounds[1]))
        .option("numPartitions", str(partitions))
        .option("fetchsize", str(fetchsize))
        .load()
    )


def read_staged_ids(
    spark: SparkSession, jdbc: JdbcTarget, conn: psycopg.Connection[Any], run_id: str
) -> DataFrame:
    """The ids the run staged, over JDBC (only read to tell a lost row from one that joined the selection)."""
    return (
        spark.read.format("jdbc")
        .options(**jdbc.options())
        .option("dbtable", staged_table(conn, run_id))
        .load()
    )
