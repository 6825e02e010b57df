"""
### retry_monitor

Every 5 minutes, checks the retry database and alerts when a threshold is crossed:

| check | value | fires above (default) |
|---|---|---|
| `oldest_overdue` | seconds the oldest pending job is past its due time | `oldest_overdue_s` 60 |
| `lateness_p99` | p99 publish lateness of the jobs published in the last `interval_s` (300 s) | `lateness_p99_s` 2.0 |
| `dead_per_hour` | jobs that went dead in the last hour (still dead) | `dead_per_hour` 1000 |
| `stuck_delivery` | seconds the longest-waiting delivery has waited (failing, or a dead job off its DLQ topic) | `stuck_delivery_s` 600 |
| `consumer_lag` | records on the retry topics not ingested yet | `consumer_lag` 100000 |
| `undelivered_dead` | dead jobs not on their DLQ topic a minute after they died | `undelivered_dead` 0 |
| `failing_deliveries` | pending jobs whose last 5 deliveries to their destination failed | `failing_deliveries` 0 |

**Once per incident**: a check that crosses its threshold sends one *firing* alert, nothing while it
stays crossed, and one *resolved* alert when it is back under. The state is kept in the table
`retry_alerts` (one row per check), so overlapping or repeated runs never alert twice; a crash
between sending and recording may repeat an alert, never lose one.

**Thresholds**: the Airflow Variable `retry_monitor_thresholds`, a JSON object overriding the
defaults, e.g. `{"oldest_overdue_s": 120, "dead_per_hour": 50, "interval_s": 600}`; `null` turns a
check off. A bad key or value fails the task with a message naming it.

**Channels** (Airflow connections, read at run time; a channel without its connection is off):

* `retry_alert_webhook` (type http): `host` is the URL (a Slack incoming webhook works as is), or
  `AIRFLOW_CONN_RETRY_ALERT_WEBHOOK='https://alerts.example.com/hook'`; extra
  `{"headers": {...}, "timeout": 10}`. The JSON body has `text` and a structured `alert`.
* `retry_alert_email`: recipients in the extra, `{"to": ["ops@example.com"]}`; mail goes out
  through Airflow's e-mail setup (the `smtp_default` connection, or `[email] email_backend`).
* the task log, always (WARNING).
* any Airflow notifier listed in `ALERT_CHANNELS` in the policies module (Slack, Apprise, SMTP...),
  its templates rendered with `alert` in the context: `text="{{ alert.summary() }}"`.

The same channels are every DAG's task failure callback. The task returns the figures and the
alerts it sent (XCom).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import DAG, task

from retry_scheduler.airflow.dags import build_dag, default_args, in_dag_file, run_failure_callbacks
from retry_scheduler.airflow.hook import RetrySchedulerHook


def arguments() -> dict:
    """The DAG's own arguments, before a factory's options."""
    return dict(
        dag_id="retry_monitor",
        schedule=timedelta(minutes=5),
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        dagrun_timeout=timedelta(minutes=4),
        default_args=default_args(retries=1, retry_delay=timedelta(seconds=30)),
        # a run that fails (or outlives its dagrun_timeout) alerts too, once, through the same channels
        on_failure_callback=run_failure_callbacks(),
        tags=["retry-scheduler", "monitoring"],
        doc_md=__doc__,
    )


def retry_monitor_tasks(hook: RetrySchedulerHook) -> None:
    """The DAG's task, reading its settings through ``hook`` when it runs."""

    @task(execution_timeout=timedelta(minutes=1))
    def check() -> dict:
        from retry_scheduler.airflow.tasks import run_monitor_task

        return run_monitor_task(hook.settings())

    check()


def retry_monitor_dag(**options: Any) -> DAG:
    """Build the ``retry_monitor`` DAG; call it from a file in the DAGs folder.

    ``options``: :class:`~retry_scheduler.airflow.dags.DagOptions` (``dag_id``, ``pool``, ``queue``...).
    """
    built = build_dag("retry_monitor_dag", options, arguments(), retry_monitor_tasks)
    return in_dag_file(built)
