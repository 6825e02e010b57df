"""Helpers of Airflow's REST API v2 that only the tests use (the service's own are
:mod:`retry_scheduler.dev.airflow_api`): a DAG's details, its backfills, a task's XCom."""

from __future__ import annotations

import time
import urllib.parse
from typing import Any

from retry_scheduler.dev.airflow_api import AirflowApiError, ApiError, api_call, dag_url, poll


def dag_details(base_url: str, token: str, dag_id: str, timeout: float = 90.0) -> dict[str, Any]:
    """The DAG as the REST API shows it (``is_paused``, ``next_dagrun_logical_date``, ...), waiting up
    to ``timeout`` s for the dag processor to have parsed it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return dict(api_call("GET", dag_url(base_url, dag_id), token))
        except ApiError as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(1)


def wait_for_backfills(
    base_url: str, token: str, dag_id: str, timeout: float = 600.0
) -> list[dict[str, Any]]:
    """Poll until every backfill of a DAG is complete (its runs finished); return them, oldest first."""
    url = f"{base_url.rstrip('/')}/api/v2/backfills?" + urllib.parse.urlencode(
        {"dag_id": dag_id, "order_by": "id"}
    )
    deadline = time.monotonic() + timeout
    while True:
        backfills = list(poll("GET", url, token, deadline)["backfills"])
        if backfills and all(b.get("completed_at") for b in backfills):
            return backfills
        if time.monotonic() > deadline:
            raise AirflowApiError(
                f"the backfills of {dag_id} are not complete after {timeout:.0f} s: {backfills}"
            )
        time.sleep(2)


def xcom_value(
    base_url: str, token: str, dag_id: str, run_id: str, task_id: str, key: str = "return_value"
) -> Any:
    """What a task instance pushed to XCom (its return value by default), deserialized."""
    url = (
        f"{dag_url(base_url, dag_id)}/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances/"
        f"{urllib.parse.quote(task_id, safe='')}/xcomEntries/{urllib.parse.quote(key, safe='')}?deserialize=true"
    )
    return api_call("GET", url, token)["value"]
