"""
### retry_compaction

Every night, moves processed jobs out of PostgreSQL into Parquet so the hot table stays small:
the jobs published during the run's day, and the dead jobs whose retention (`dead_retention`, 30
days) ended by the day's end. A dead job whose record is not yet on its DLQ topic is never taken.
Each run's data interval is one UTC day; the run starts once the day is over. Catch-up and `airflow backfill create` re-run exactly the days asked for, one day at a time (the `compact` task runs once at a time across runs); a
manual trigger archives the last complete day before the logical date it is given. Running a day twice neither duplicates
archive rows nor deletes rows that are not in the archive: rows are deleted, in bounded batches,
only after the archive was made durable (fsynced, on a local archive) and read back and found to
hold every one of them.

Each run that archived its day updates the Asset `retry_scheduler_archive` (extra: `day`,
`archive`): schedule a DAG on `retry_scheduler.airflow.assets.archive_asset()` to load each day.

Archive: `RETRY_ARCHIVE_URI` (a local directory or any Hadoop-compatible URI), partitioned by
`day` and `destination`, with a JSON manifest per run. Same job on the command line:
`retry-scheduler compact`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import DAG, Param, get_current_context, task

from retry_scheduler.airflow.assets import archive_asset
from retry_scheduler.airflow.dags import (
    build_dag,
    default_args,
    in_dag_file,
    run_failure_callbacks,
    utc_intervals,
    with_deadline,
)
from retry_scheduler.airflow.hook import RetrySchedulerHook
from retry_scheduler.airflow.operators import spark_submit_operator
from retry_scheduler.spark.submit import COMPACT_APP

#: A run still going this long after it was queued alerts (the factory's ``deadline``).
DEADLINE = timedelta(hours=2)


def arguments() -> dict:
    """The DAG's own arguments, before a factory's options."""
    return dict(
        dag_id="retry_compaction",
        # A data interval per UTC day: the run for day D starts once D is over and archives exactly D.
        schedule=utc_intervals("0 0 * * *"),
        # Catch-up fills days missed while the scheduler was down; a day is safe to run again.
        start_date=pendulum.datetime(2026, 11, 20, tz="UTC"),
        catchup=True,
        max_active_runs=1,
        default_args=default_args(retries=2, retry_delay=timedelta(minutes=5)),
        # a run that fails (or outlives its dagrun_timeout) alerts too, once, through the same channels
        on_failure_callback=run_failure_callbacks(),
        params={
            "dead_retention": Param(
                "30d",
                type="string",
                pattern=r"^(\d+(ms|s|m|h|d))+$",
                title="Keep dead jobs in PostgreSQL for",
            ),
        },
        tags=["retry-scheduler", "spark", "maintenance"],
        doc_md=__doc__,
    )


def retry_compaction_tasks(hook: RetrySchedulerHook) -> None:
    """The DAG's tasks, reading their settings through ``hook`` when they run."""

    @task
    def job_args() -> list[str]:
        """The day to archive is the run's data interval (no connection here: the operator hands those over)."""
        from retry_scheduler.spark.submit import compact_args

        context = get_current_context()
        start = context["data_interval_start"]
        if start is None:
            raise ValueError("retry_compaction needs a data interval: trigger it with a logical date")
        day = start.strftime("%Y-%m-%d")
        return compact_args(day=day, dead_retention=context["params"]["dead_retention"])

    spark_submit_operator(
        task_id="compact",
        application=COMPACT_APP,
        name="retry_compaction",
        hook=hook,
        application_args=job_args(),
        # One compaction at a time holds the lock; a backfill's runs (which the DAG's max_active_runs
        # does not limit) would otherwise start side by side and all but one fail into their retries.
        max_active_tis_per_dag=1,
        # Each run that archived its day updates the archive's Asset (extra: day, archive).
        outlets=[archive_asset()],
    )


def retry_compaction_dag(deadline: timedelta | None = DEADLINE, **options: Any) -> DAG:
    """Build the ``retry_compaction`` DAG; call it from a file in the DAGs folder.

    ``deadline``: a run still going this long after it was queued alerts (a Deadline Alert, through
    the failure channels); ``None`` turns it off. ``options``:
    :class:`~retry_scheduler.airflow.dags.DagOptions` (``dag_id``, ``pool``, ``queue``...).
    """
    built = build_dag("retry_compaction_dag", options, arguments(), retry_compaction_tasks)
    return in_dag_file(with_deadline(built, deadline))
