"""A small Spark job that touches what the real jobs use, so the JVM can archive the classes it loads.

``retry-scheduler dev spark-archive`` runs it once with ``-XX:ArchiveClassesAtExit``: the Java 17
class-data sharing archive it leaves lets every later ``spark-submit`` of ``bulk_retry.py`` and
``compact.py`` map those classes instead of loading and verifying them again (about a third of a
Spark job's start-up here, bench/README.md). It needs no database and no broker::

    spark-submit include/spark/warm_up.py /tmp/scratch-dir
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def _double(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield pa.RecordBatch.from_arrays([pa.compute.multiply(batch.column(0), 2)], names=["id"])


def warm_up(spark: SparkSession, scratch: Path) -> int:
    """Arrow batches through a Python worker, a partitioned Parquet write and read, a join; returns a count."""
    rows = spark.range(0, 20_000, numPartitions=2).mapInArrow(_double, "id long")
    rows = rows.withColumn("day", F.date_from_unix_date((F.col("id") % 3).cast("int")).cast("string"))
    rows = rows.withColumn("at", F.timestamp_seconds(F.col("id")))
    rows.write.mode("overwrite").partitionBy("day").parquet(str(scratch / "warm_up"))
    back = spark.read.parquet(str(scratch / "warm_up"))
    return back.join(rows.select("id"), on="id", how="left_semi").count()


def main(argv: list[str]) -> int:
    spark = SparkSession.builder.appName("retry-warm-up").getOrCreate()
    try:
        with tempfile.TemporaryDirectory(dir=argv[0] if argv else None) as scratch:
            count = warm_up(spark, Path(scratch))
    finally:
        spark.stop()
    print(json.dumps({"rows": count}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
