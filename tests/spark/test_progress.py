"""The jobs' progress lines (:mod:`retry_scheduler.spark.progress`) against a real local SparkContext."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from retry_scheduler.spark.progress import parse, reporting

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_the_last_line_counts_every_stage_of_the_block_even_one_no_poll_saw(spark: SparkSession) -> None:
    # A loaded machine can start and finish a small job between two polls: polls an hour apart stand
    # for that. The last line must still count the block's tasks (3 + 5), and none of the job before it.
    context = spark.sparkContext
    assert context.parallelize(range(14), 7).count() == 14  # before the block: not its work
    out = io.StringIO()

    with reporting("compact", every_s=3600, stream=out):
        assert context.parallelize(range(9), 3).count() == 9
        assert context.parallelize(range(10), 5).map(lambda n: n * 2).sum() == 90

    lines = out.getvalue().splitlines()
    assert lines == ["PROGRESS compact: 8/8 Spark tasks"]
    assert parse(lines[-1]) == ("compact", 8, 8)


def test_while_the_block_runs_the_figure_moves_and_ends_complete(spark: SparkSession) -> None:
    context = spark.sparkContext
    out = io.StringIO()

    with reporting("bulk-retry", every_s=0.05, stream=out):
        for _ in range(3):
            assert context.parallelize(range(4), 4).map(lambda n: n).count() == 4

    steps = [parse(text) for text in out.getvalue().splitlines()]
    assert steps and steps[-1] == ("bulk-retry", 12, 12), steps
    assert all(step is not None and step[0] == "bulk-retry" for step in steps)
    done = [step[1] for step in steps if step is not None]
    assert done == sorted(done)  # the figure never goes back


def test_a_stage_spark_skips_is_not_counted(spark: SparkSession) -> None:
    # The second count reuses the first one's shuffle output: its map stage is skipped, no task runs.
    pairs = spark.sparkContext.parallelize(range(10), 2).map(lambda n: (n % 3, n)).reduceByKey(max, 3)
    out = io.StringIO()

    with reporting("compact", every_s=3600, stream=out):
        assert pairs.count() == 3  # 2 map tasks, 3 reduce tasks
        assert pairs.count() == 3  # 3 reduce tasks

    assert out.getvalue().splitlines() == ["PROGRESS compact: 8/8 Spark tasks"]
