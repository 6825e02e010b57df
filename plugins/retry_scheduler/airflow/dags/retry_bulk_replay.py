"""
### retry_bulk_replay

Re-publishes a large, filtered set of jobs with PySpark: for example every dead job of
`payments` after a payment-provider outage. **Run it as a dry run first** (the default): the
task log then shows how many jobs match, per destination, and nothing is sent.

Spark reads the selected rows from PostgreSQL over JDBC in parallel partitions by id, the
executors publish them with idempotent producers (same `retry.id`, `retry.attempt` raised,
headers byte for byte as the normal publish path sends them), and exactly the acknowledged
jobs are marked published. A re-run after a crash re-publishes at most the jobs that were not
marked. One run at a time; each run, dry runs included, is audited in `retry_dlq_audit`
(`retry-scheduler dlq audit`) with who triggered it. Same job on the command line: `retry-scheduler bulk-retry`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import DAG, Param, get_current_context, task

from retry_scheduler.airflow.assets import replays_asset
from retry_scheduler.airflow.dags import (
    build_dag,
    default_args,
    in_dag_file,
    run_failure_callbacks,
    with_deadline,
)
from retry_scheduler.airflow.dags.forms import rate_param, selection_params
from retry_scheduler.airflow.hook import RetrySchedulerHook
from retry_scheduler.airflow.operators import spark_submit_operator
from retry_scheduler.spark.submit import BULK_RETRY_APP

#: A run still going this long after it was queued alerts (the factory's ``deadline``).
DEADLINE = timedelta(hours=2)


def arguments() -> dict:
    """The DAG's own arguments, before a factory's options."""
    return dict(
        dag_id="retry_bulk_replay",
        schedule=None,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        default_args=default_args(retries=1, retry_delay=timedelta(seconds=30)),
        # a run that fails (or outlives its dagrun_timeout) alerts too, once, through the same channels
        on_failure_callback=run_failure_callbacks(),
        params={
            **selection_params(status=True),
            "rate": rate_param(
                "Empty or 0: as fast as Spark publishes (the bulk retry is the fast path; the dlq_replay "
                "DAG paces large replays by default)."
            ),
            "dry_run": Param(
                True, type="boolean", title="Dry run", description="Only count; publish nothing."
            ),
        },
        tags=["retry-scheduler", "spark", "operations"],
        doc_md=__doc__,
    )


def retry_bulk_replay_tasks(hook: RetrySchedulerHook) -> None:
    """The DAG's tasks, reading their settings through ``hook`` when they run."""

    @task
    def job_args() -> list[str]:
        """Validate the form and turn it into the job's arguments (no connection: the operator hands those over)."""
        from retry_scheduler.spark.submit import bulk_retry_args, dag_audit_args

        context = get_current_context()
        dag_run = context["dag_run"]
        audit = dag_audit_args(getattr(dag_run, "triggering_user_name", None), dag_run.run_id)
        return bulk_retry_args(context["params"], hook.settings()) + audit

    @task(outlets=[replays_asset()])
    def record() -> dict:
        """The run's replay as an event of the ``retry_scheduler_replays`` asset (skipped for a dry run)."""
        from retry_scheduler.airflow.tasks import record_replay
        from retry_scheduler.spark.submit import job_run_id

        run_id = job_run_id(get_current_context()["dag_run"].run_id)  # as the job audited it
        return record_replay(get_current_context()["dag_run"].dag_id, run_id, "bulk_replay", hook.settings())

    bulk = spark_submit_operator(
        task_id="bulk_retry",
        application=BULK_RETRY_APP,
        name="retry_bulk_replay",
        hook=hook,
        application_args=job_args(),
    )
    bulk >> record()


def retry_bulk_replay_dag(deadline: timedelta | None = DEADLINE, **options: Any) -> DAG:
    """Build the ``retry_bulk_replay`` DAG; call it from a file in the DAGs folder.

    ``deadline``: a run still going this long after it was queued alerts (a Deadline Alert, through
    the failure channels); ``None`` turns it off. ``options``:
    :class:`~retry_scheduler.airflow.dags.DagOptions` (``dag_id``, ``pool``, ``queue``...).
    """
    built = build_dag("retry_bulk_replay_dag", options, arguments(), retry_bulk_replay_tasks)
    return in_dag_file(with_deadline(built, deadline))
