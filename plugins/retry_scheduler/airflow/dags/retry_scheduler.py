"""
### retry_scheduler

Moves failed Kafka records from the retry topics back to their destinations when they are due.

* **ingest** consumes the retry topics (`retry` and the per-delay topics) into the PostgreSQL
  table `retry_jobs`, committing Kafka offsets only after the rows are committed.
* **publish** claims due jobs (`FOR UPDATE SKIP LOCKED`, with a lease), produces them with an
  idempotent producer, and marks them published once the broker acknowledged them. Dead jobs
  go to their policy's DLQ topic. `RETRY_PUBLISH_TASKS` (read when this file is parsed) maps it
  into that many tasks side by side, which the CeleryExecutor can spread over its workers.

Both tasks loop for `loop_seconds` (default 90 s) and a run starts every minute, so runs
overlap by about 30 s. A loop whose time is up also keeps going until the next run's loop is
alive (heartbeats in `retry_loops`, grace `RETRY_LOOP_GRACE_MS`, 60 s), so even a late run
leaves no gap. Overlapping publishers are safe because claims skip locked rows; one ingest
loop at a time owns the retry topics (an advisory lock), the next one taking over at once.
Counts are in the task logs and in XCom.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import DAG, Param, get_current_context, task

from retry_scheduler.airflow.dags import build_dag, default_args, in_dag_file, run_failure_callbacks
from retry_scheduler.airflow.hook import RetrySchedulerHook

LOOP_SECONDS = 90


def arguments() -> dict:
    """The DAG's own arguments, before a factory's options."""
    return dict(
        dag_id="retry_scheduler",
        schedule=timedelta(minutes=1),
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=3,
        dagrun_timeout=timedelta(minutes=10),
        default_args=default_args(retries=2, retry_delay=timedelta(seconds=5)),
        # a run that fails (or outlives its dagrun_timeout) alerts too, once, through the same channels
        on_failure_callback=run_failure_callbacks(),
        params={
            "loop_seconds": Param(
                LOOP_SECONDS, type="integer", minimum=1, maximum=3600, description="How long each task loops."
            )
        },
        tags=["retry-scheduler", "kafka"],
        doc_md=__doc__,
    )


def retry_scheduler_tasks(hook: RetrySchedulerHook) -> None:
    """The DAG's tasks, reading their settings through ``hook`` when they run."""

    @task(execution_timeout=timedelta(minutes=5))
    def ingest() -> dict:
        from retry_scheduler.airflow.metrics import AirflowMetrics
        from retry_scheduler.airflow.tasks import run_ingest

        loop_seconds = float(get_current_context()["params"]["loop_seconds"])
        return run_ingest(loop_seconds, hook.settings(), metrics=AirflowMetrics())

    @task(execution_timeout=timedelta(minutes=5))
    def publish(shard: int = 0) -> dict:
        """One publisher group; ``shard`` only tells the mapped copies apart (they share the queue)."""
        from retry_scheduler.airflow.metrics import AirflowMetrics
        from retry_scheduler.airflow.tasks import run_publish

        loop_seconds = float(get_current_context()["params"]["loop_seconds"])
        return run_publish(loop_seconds, hook.settings(), metrics=AirflowMetrics())

    ingest()
    tasks = publish_tasks(hook)
    if tasks == 1:
        publish()
    else:  # claims skip locked rows: the copies share the due jobs without publishing one twice
        publish.expand(shard=list(range(tasks)))


def publish_tasks(hook: RetrySchedulerHook) -> int:
    """``RETRY_PUBLISH_TASKS`` when the DAG file is parsed (the environment's, or the factory's
    ``settings``): how many publish tasks a run maps."""
    import os

    from retry_scheduler.core.config import Settings

    return Settings.from_env({**os.environ, **hook.environment}).publish_tasks


def retry_scheduler_dag(**options: Any) -> DAG:
    """Build the ``retry_scheduler`` DAG; call it from a file in the DAGs folder.

    ``options``: :class:`~retry_scheduler.airflow.dags.DagOptions` (``dag_id``, ``pool``, ``queue``...).
    """
    built = build_dag("retry_scheduler_dag", options, arguments(), retry_scheduler_tasks)
    return in_dag_file(built)
