"""
### dlq_window_replay

Replays, once, every **dead** job that went dead inside the run's data interval (one UTC hour,
`[start, end)`), narrowed by the form's filter. It is the DAG to **backfill** after an outage, in
one command:

```
airflow backfill create --dag-id dlq_window_replay \
    --from-date 2026-11-20T08:00:00+00:00 --to-date 2026-11-20T11:00:00+00:00 \
    --reprocess-behavior completed \
    --dag-run-conf '{"dry_run": false, "destination": "payments"}'
```

Each hour of the range becomes its own run, with its own log, XCom and audit row
(`retry_dlq_audit`, source `dag`, the run's id, the filter with the hour's `since` and `until`).
**Dry run is on by default**: without `"dry_run": false` a run only counts the hour's dead jobs.
A replayed job is due at once and is no longer dead, so running an hour again replays nothing
more (`--reprocess-behavior completed` is safe, and makes a second backfill of the same hours,
with another filter, run them again). Jobs that went dead as `invalid` are left alone, as in
`dlq_replay`.

The DAG makes **no runs of its own**: its end date is its start date, so the scheduler never
schedules it (a backfill's runs are not bound by the DAG's dates), and it is created unpaused, so
a backfill runs at once. No scheduled run can take an hour before the backfill does. Manual
runs are refused where Airflow supports `allowed_run_types` (3.2 and later). Ad-hoc filters over
any span: `dlq_replay`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import DAG, get_current_context, task

from retry_scheduler.airflow.assets import replays_asset
from retry_scheduler.airflow.dags import (
    build_dag,
    default_args,
    in_dag_file,
    run_failure_callbacks,
    utc_intervals,
)
from retry_scheduler.airflow.dags.forms import replay_option_params, selection_params
from retry_scheduler.airflow.hook import RetrySchedulerHook

#: The DAG's start and end date: the scheduler schedules nothing of it, backfills any hour.
BACKFILLS_ONLY = pendulum.datetime(2026, 1, 1, tz="UTC")


def backfills_and_scheduled() -> dict:
    """``allowed_run_types`` where Airflow has it (3.2+): no manual runs, whose tasks the end date
    would leave out (a run that does nothing, silently). Scheduled runs must stay allowed for a DAG
    with a schedule, and none is ever made."""
    import inspect

    if "allowed_run_types" not in inspect.signature(DAG.__init__).parameters:
        return {}
    return {"allowed_run_types": ["scheduled", "backfill"]}


def arguments() -> dict:
    """The DAG's own arguments, before a factory's options."""
    return dict(
        dag_id="dlq_window_replay",
        # A data interval per UTC hour: the run for hour H starts once H is over and replays exactly H.
        schedule=utc_intervals("0 * * * *"),
        # Backfills only: the scheduler makes no run after the end date, a backfill's runs ignore it.
        start_date=BACKFILLS_ONLY,
        end_date=BACKFILLS_ONLY,
        catchup=False,
        is_paused_upon_creation=False,
        **backfills_and_scheduled(),
        max_active_runs=1,
        dagrun_timeout=timedelta(hours=6),
        # a retry continues where a failed run stopped: replayed jobs are no longer dead
        default_args=default_args(retries=1, retry_delay=timedelta(seconds=30)),
        # a run that fails (or outlives its dagrun_timeout) alerts too, once, through the same channels
        on_failure_callback=run_failure_callbacks(),
        params={
            **selection_params(window=False),
            **replay_option_params(),
        },
        tags=["retry-scheduler", "operations"],
        doc_md=__doc__,
    )


def dlq_window_replay_tasks(hook: RetrySchedulerHook) -> None:
    """The DAG's tasks, reading their settings through ``hook`` when they run."""

    @task
    def replay_window() -> dict:
        """Replay the dead jobs that went dead in the run's data interval (or only count them)."""
        from retry_scheduler.airflow.tasks import run_window_replay

        context = get_current_context()
        dag_run = context["dag_run"]
        return run_window_replay(
            dict(context["params"]),
            context["data_interval_start"],
            context["data_interval_end"],
            getattr(dag_run, "triggering_user_name", None),
            dag_run.run_id,
            hook.settings(),
        )

    @task(outlets=[replays_asset()])
    def record() -> dict:
        """The run's replay as an event of the ``retry_scheduler_replays`` asset (skipped for a dry run)."""
        from retry_scheduler.airflow.tasks import record_replay

        dag_run = get_current_context()["dag_run"]
        return record_replay(dag_run.dag_id, dag_run.run_id, "replay", hook.settings())

    replay_window() >> record()


def dlq_window_replay_dag(**options: Any) -> DAG:
    """Build the ``dlq_window_replay`` DAG; call it from a file in the DAGs folder.

    ``options``: :class:`~retry_scheduler.airflow.dags.DagOptions` (``dag_id``, ``pool``, ``queue``...).
    """
    built = build_dag("dlq_window_replay_dag", options, arguments(), dlq_window_replay_tasks)
    return in_dag_file(built)
