"""A small client of Airflow's REST API v2 (urllib only): token, DAGs, runs, backfills."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


class AirflowApiError(RuntimeError):
    """Airflow did not do what was asked in time; the message says what to look at."""


class ApiError(AirflowApiError):
    """The Airflow REST API answered with an HTTP error (``status``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


#: How long one request waits for the api-server's answer.
API_TIMEOUT_S = 30.0


class ApiTimeout(AirflowApiError):
    """The api-server did not answer a request in time."""


def api_call(method: str, url: str, token: str | None = None, body: Any = None) -> Any:
    """One request to the REST API (JSON in and out, ``Bearer token``); what it answered."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data, headers, method=method), timeout=API_TIMEOUT_S
        ) as r:
            payload = r.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        raise ApiError(exc.code, f"{method} {url} failed with HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, TimeoutError) as exc:
        # A timeout while connecting comes wrapped in URLError, one while reading the answer bare.
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, TimeoutError):
            raise ApiTimeout(f"{method} {url}: no answer within {API_TIMEOUT_S:g} s") from None
        raise AirflowApiError(f"Cannot reach {url} ({reason}): is the Airflow api-server up?") from None
    return json.loads(payload) if payload else None


def poll(method: str, url: str, token: str, deadline: float) -> Any:
    """``api_call`` for a loop that polls until ``deadline``: a request the api-server was too busy to
    answer in time is asked again (a machine running much else), until the deadline."""
    while True:
        try:
            return api_call(method, url, token)
        except ApiTimeout:
            if time.monotonic() > deadline:
                raise


def api_token(base_url: str, username: str = "admin", password: str = "admin") -> str:
    """A JWT from the simple auth manager's ``POST /auth/token``, for the API's ``Bearer`` header."""
    body = {"username": username, "password": password}
    return str(api_call("POST", f"{base_url.rstrip('/')}/auth/token", body=body)["access_token"])


def dag_url(base_url: str, dag_id: str) -> str:
    """The REST API's URL of DAG ``dag_id``."""
    return f"{base_url.rstrip('/')}/api/v2/dags/{urllib.parse.quote(dag_id, safe='')}"


def unpause_dag(base_url: str, token: str, dag_id: str, timeout: float = 90.0) -> dict[str, Any]:
    """Unpause a DAG, waiting up to ``timeout`` s for the dag processor to have parsed it."""
    return set_paused(base_url, token, dag_id, False, timeout)


def set_paused(base_url: str, token: str, dag_id: str, paused: bool, timeout: float = 90.0) -> dict[str, Any]:
    """Pause or unpause a DAG, waiting up to ``timeout`` s for the dag processor to have parsed it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return dict(api_call("PATCH", dag_url(base_url, dag_id), token, {"is_paused": paused}))
        except ApiError as exc:
            if exc.status != 404:
                raise
            if time.monotonic() > deadline:
                raise AirflowApiError(
                    f"Airflow still does not know DAG {dag_id} after {timeout:.0f} s: "
                    "look for import errors (airflow dags list-import-errors)"
                ) from None
        time.sleep(1)


def dag_runs(base_url: str, token: str, dag_id: str, run_type: str | None = None) -> list[dict[str, Any]]:
    """Every run of a DAG (oldest logical date first), or only those of ``run_type`` (``backfill``, ...)."""
    query = urllib.parse.urlencode(
        {"limit": 1000, "order_by": "logical_date", **({"run_type": run_type} if run_type else {})}
    )
    return list(api_call("GET", f"{dag_url(base_url, dag_id)}/dagRuns?{query}", token)["dag_runs"])


def fail_unfinished_runs(base_url: str, token: str, dag_id: str) -> list[str]:
    """Mark every queued or running run of a DAG failed (Airflow then fails its running tasks and
    skips the rest); returns their run ids. Pause the DAG first, or the scheduler starts new ones."""
    unfinished = [
        r["dag_run_id"] for r in dag_runs(base_url, token, dag_id) if r["state"] in {"queued", "running"}
    ]
    for run_id in unfinished:
        url = f"{dag_url(base_url, dag_id)}/dagRuns/{urllib.parse.quote(run_id, safe='')}"
        api_call("PATCH", url, token, {"state": "failed"})
    return unfinished


def trigger_dag(
    base_url: str, token: str, dag_id: str, conf: dict[str, Any] | None = None, run_id: str | None = None
) -> dict[str, Any]:
    """Start a manual run now; the returned DAG run carries ``dag_run_id`` and ``state``."""
    body: dict[str, Any] = {"logical_date": None, "conf": conf or {}}
    if run_id:
        body["dag_run_id"] = run_id
    return dict(api_call("POST", f"{dag_url(base_url, dag_id)}/dagRuns", token, body))


def wait_for_dag_run(
    base_url: str, token: str, dag_id: str, run_id: str, timeout: float = 300.0
) -> dict[str, Any]:
    """Poll a DAG run until it is ``success`` or ``failed`` and return it; DevStackError on timeout."""
    url = f"{dag_url(base_url, dag_id)}/dagRuns/{urllib.parse.quote(run_id, safe='')}"
    deadline = time.monotonic() + timeout
    while (run := dict(poll("GET", url, token, deadline))).get("state") not in {"success", "failed"}:
        if time.monotonic() > deadline:
            raise AirflowApiError(f"DAG run {dag_id}/{run_id} still {run.get('state')} after {timeout:.0f} s")
        time.sleep(1)
    return run
