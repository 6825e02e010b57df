"""The DAGs of the service, as factories: a deployment's DAGs folder holds one thin file per DAG.

Each factory builds its DAG when called, so a DAG file is two lines::

    from retry_scheduler.airflow.dags.retry_scheduler import retry_scheduler_dag

    dag = retry_scheduler_dag()

The DAG belongs to the file that called the factory (its ``fileloc``), so Airflow finds, parses and
runs it from the DAGs folder like any other DAG.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk import DAG


def default_args(*, retries: int, retry_delay: timedelta) -> dict[str, Any]:
    """What every task of the service's DAGs takes: its owner, its retries, and the failure alerts."""
    from retry_scheduler.airflow.notifiers import failure_notifiers

    return {
        "owner": "retry-scheduler",
        "retries": retries,
        "retry_delay": retry_delay,
        "on_failure_callback": failure_notifiers(),
    }


def utc_intervals(cron: str) -> Any:
    """A schedule whose runs each cover one interval of ``cron`` in UTC (a day, an hour): the data
    interval a run archives or replays, created once the interval is over."""
    try:
        from airflow.sdk import CronDataIntervalTimetable
    except ImportError:  # Airflow 3.1 has it only here
        from airflow.timetables.interval import CronDataIntervalTimetable  # type: ignore[assignment]
    return CronDataIntervalTimetable(cron, timezone="UTC")


def run_failure_callbacks() -> list[Callable[[Any], None]]:
    """What every DAG of the service takes as its own ``on_failure_callback``: the failure alerts of
    its tasks, for a run that fails or outlives its ``dagrun_timeout``."""
    from retry_scheduler.airflow.notifiers import failure_notifiers

    return list(failure_notifiers())


def with_deadline(dag: DAG, after: timedelta | None) -> DAG:
    """Give *dag* a Deadline Alert: a run still going ``after`` its queueing alerts through the
    failure channels (``retry_scheduler.airflow.deadlines``); ``None``: no deadline."""
    if after is not None:
        from retry_scheduler.airflow.deadlines import deadline_alert

        dag.deadline = deadline_alert(after)
    return dag


def in_dag_file(dag: DAG) -> DAG:
    """Give *dag* the file of the factory's caller: the DAG file Airflow parsed, not this package."""
    caller = sys._getframe(2)
    dag.fileloc = caller.f_code.co_filename
    return dag
