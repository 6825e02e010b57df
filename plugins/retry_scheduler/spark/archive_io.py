"""The compaction's Parquet archive: its files through Hadoop's file system, writing, syncing, the
manifest, and the check of the files a run wrote against its staging.

Used by :mod:`retry_scheduler.spark.compaction`; any Hadoop-compatible URI (``file://``, ``s3a://``,
``hdfs://``) goes through the same calls.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from retry_scheduler.db.compaction import ArchiveVerificationError
from retry_scheduler.spark.compaction_reads import ARCHIVED_ID_SCHEMA, PARTITION_COLUMNS, local_path


def _hadoop_path(spark: SparkSession, uri: str) -> tuple[Any, Any]:
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "compaction needs a classic (not Spark Connect) session"
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return path, path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())


def path_exists(spark: SparkSession, uri: str) -> bool:
    path, fs = _hadoop_path(spark, uri)
    return bool(fs.exists(path))


def write_text_hadoop(spark: SparkSession, uri: str, text: str) -> None:
    """Write a small file through the Hadoop file system of ``uri`` (s3a://, hdfs://, abfs://, ...)."""
    path, fs = _hadoop_path(spark, uri)
    stream = fs.create(path, True)
    try:
        stream.write(bytearray(text.encode()))
    finally:
        stream.close()


def archive_files(spark: SparkSession, root: str, days: Sequence[str]) -> set[str]:
    """The Parquet files of the archive's ``days``, as readers see them (no ``_temporary`` or hidden files)."""
    files: set[str] = set()
    for day in days:
        path, fs = _hadoop_path(spark, f"{root}/day={day}")
        if not fs.exists(path):
            continue
        listing = fs.listFiles(path, True)
        while listing.hasNext():
            name = str(listing.next().getPath().toString())
            inside = name.split(f"/day={day}/", 1)[-1]
            if name.endswith(".parquet") and not any(part[:1] in "._" for part in inside.split("/")):
                files.add(name)
    return files


def file_digests(spark: SparkSession, files: Sequence[str]) -> tuple[list[dict[str, Any]], DataFrame]:
    """Per file: its rows and a checksum of its ids (their sum and XOR), read back from the archive.

    Also returns the files' ids (column ``id``) for the checks against the staged selection.
    """
    ids = (
        spark.read.schema(ARCHIVED_ID_SCHEMA).parquet(*files).select(F.input_file_name().alias("file"), "id")
    )
    per_file = ids.groupBy("file").agg(
        F.count("*").alias("rows"), F.sum("id").alias("id_sum"), F.bit_xor("id").alias("id_xor")
    )
    digests = [
        {"file": row.file, "rows": int(row.rows), "id_sum": int(row.id_sum), "id_xor": int(row.id_xor)}
        for row in per_file.orderBy("file").collect()
    ]
    return digests, ids.select("id")


def read_archived_ids(spark: SparkSession, root: str, days: Sequence[str]) -> DataFrame | None:
    """Ids archived under ``root`` for ``days`` (only those day partitions are listed and read); None if none."""
    paths = [f"{root}/day={day}" for day in days]
    present = [p for p in paths if path_exists(spark, p)]
    if not present:
        return None
    return spark.read.schema(ARCHIVED_ID_SCHEMA).option("basePath", root).parquet(*present).select("id")


@contextmanager
def _sql_conf(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    previous = spark.conf.get(key)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


def write_archive(rows: DataFrame, root: str) -> None:
    """Append ``rows`` (with their ``day`` and ``destination`` columns) to the archive under ``root``."""
    # Standard Parquet timestamps rather than Spark's legacy INT96, for any reader of the archive.
    with _sql_conf(rows.sparkSession, "spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS"):
        rows.write.mode("append").partitionBy(*PARTITION_COLUMNS).parquet(root)


def sync_archive(root: str, days: Sequence[str]) -> int:
    """Make the archive's ``days`` durable before anything is deleted; returns the files synced.

    On a local archive (``file://``) every file and directory under ``root/day=D`` is fsynced, then
    ``root`` and its parent, so that a power cut after the delete cannot take back rows the
    verification saw. Other file systems are durable when Spark's job commit returns (HDFS: the
    blocks are replicated; S3A: the objects exist once written, with a committer such as the S3A
    magic committer), and nothing is done here.
    """
    local = local_path(root)
    if local is None:
        return 0
    synced = 0

    def fsync(path: Path, directory: bool) -> None:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    for day in days:
        top = local / f"day={day}"
        if not top.is_dir():
            continue
        for walked, _dirs, files in os.walk(top, topdown=False):
            for name in files:
                fsync(Path(walked) / name, directory=False)
                synced += 1
            fsync(Path(walked), directory=True)
    for folder in (local, local.parent):
        if folder.is_dir():
            fsync(folder, directory=True)
    return synced


def write_manifest(spark: SparkSession, archive: str, report: dict[str, Any]) -> str:
    """Write ``<archive>/_manifests/<run_id>.json``; returns its URI."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", report["run_id"]) + ".json"
    uri = f"{archive}/_manifests/{name}"
    text = json.dumps(report, indent=2, sort_keys=True) + "\n"
    local = local_path(uri)
    if local is None:
        write_text_hadoop(spark, uri, text)
    else:
        local.parent.mkdir(parents=True, exist_ok=True)
        partial = local.with_name(f".{local.name}.partial")
        with open(partial, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        partial.replace(local)
    return uri


def check_written(
    spark: SparkSession,
    staged: DataFrame,
    written: Sequence[str],
    existing: DataFrame | None,
    root: str,
) -> list[dict[str, Any]]:
    """Check the files this run wrote against its staged selection; return their digests (for the manifest).

    Read back after the sync: every id in them was staged by this run, none is there twice, and none
    was already in the archive before the write. With the digests (rows, sum and XOR of the ids per
    file) in the manifest, any reader can later check each file on its own.
    """
    if not written:
        return []
    digests, ids = file_digests(spark, written)
    rows = sum(d["rows"] for d in digests)
    stray = ids.join(staged, on="id", how="left_anti").count()
    twice = rows - ids.distinct().count()
    if existing is not None:
        twice += ids.join(existing, on="id", how="left_semi").count()
    if stray or twice:
        raise ArchiveVerificationError(
            f"the {len(written)} files this run wrote under {root} hold {stray} rows it did not stage and "
            f"{twice} ids already archived; nothing was deleted. Move those files aside ({', '.join(written[:5])}"
            f"{', ...' if len(written) > 5 else ''}), then run the compaction again."
        )
    for digest in digests:  # paths relative to the archive's root, as they stay valid if it moves
        digest["file"] = _relative(digest["file"], root)
    return digests


def _relative(file: str, root: str) -> str:
    """A file of the archive as its manifest names it: relative to ``root`` (as it came when outside it)."""
    prefix = f"{root}/"
    return file.split(prefix, 1)[-1] if prefix in file else file


def _read_text_hadoop(spark: SparkSession, uri: str) -> str:
    path, fs = _hadoop_path(spark, uri)
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    stream = fs.open(path)
    try:
        out = jvm.java.io.ByteArrayOutputStream()
        jvm.org.apache.hadoop.io.IOUtils.copyBytes(stream, out, 65536, False)
        return str(out.toString("UTF-8"))
    finally:
        stream.close()


def recorded_digests(
    spark: SparkSession, archive: str, days: Sequence[str]
) -> dict[str, tuple[str, dict[str, Any]]]:
    """The per-file digests the runs' manifests under ``archive`` recorded for files of ``days``:
    ``{file relative to the archive's root: (manifest name, digest)}``."""
    path, fs = _hadoop_path(spark, f"{archive}/_manifests")
    if not fs.exists(path):
        return {}
    prefixes = tuple(f"day={day}/" for day in days)
    recorded: dict[str, tuple[str, dict[str, Any]]] = {}
    for status in fs.listStatus(path):
        name = str(status.getPath().getName())
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            manifest = json.loads(_read_text_hadoop(spark, f"{archive}/_manifests/{name}"))
        except ValueError as exc:
            raise ArchiveVerificationError(
                f"the manifest {archive}/_manifests/{name} is not JSON ({exc}); nothing was deleted. Restore it, "
                "or move it aside if the files it lists are known good, then run the compaction again."
            ) from None
        for digest in manifest.get("files") or []:
            if str(digest.get("file", "")).startswith(prefixes):
                recorded[digest["file"]] = (name, digest)
    return recorded


def compare_digests(spark: SparkSession, root: str, recorded: dict[str, tuple[str, dict[str, Any]]]) -> None:
    """Read each recorded file back and compare its rows and id checksum with the manifest's; a file
    missing or changed raises :class:`ArchiveVerificationError` (naming it and its manifest)."""
    if not recorded:
        return
    missing = [rel for rel in sorted(recorded) if not path_exists(spark, f"{root}/{rel}")]
    present = [rel for rel in sorted(recorded) if rel not in missing]
    found: dict[str, dict[str, Any]] = {}
    if present:
        digests, _ = file_digests(spark, [f"{root}/{rel}" for rel in present])
        found = {_relative(digest["file"], root): digest for digest in digests}
    changed = [
        rel
        for rel in present
        if any(found.get(rel, {}).get(k) != recorded[rel][1].get(k) for k in ("rows", "id_sum", "id_xor"))
    ]
    if missing or changed:
        where = [
            f"{rel} (manifest {recorded[rel][0]}, {'missing' if rel in missing else 'changed'})"
            for rel in [*missing, *changed]
        ]
        raise ArchiveVerificationError(
            f"{len(where)} archived file(s) under {root} no longer match the rows and id checksum their "
            f"manifest recorded: {', '.join(where[:5])}{', ...' if len(where) > 5 else ''}; nothing was deleted. "
            "Restore them from a backup (or, if the loss is accepted, move their manifest aside), then run "
            "the compaction again."
        )
