"""The Dead letters page's access and database: who may read and act, and the pool of the retry
database its requests share.

Security, all of it Airflow's own:

- **Who**: the user comes from Airflow's ``get_user`` (``airflow.api_fastapi.core_api.security``):
  the ``Authorization: Bearer`` JWT, else the ``_token`` cookie the Airflow UI sets at login. A page
  request without a login is redirected to the auth manager's login URL with a ``next`` back here;
  an API request gets 401.
- **What**: through Airflow's ``requires_access_dag`` for the runs of the ``dlq_replay`` DAG, the
  DAG that replays and purges dead jobs: reading needs ``GET`` (who may see that DAG's runs may see
  the jobs it acts on), replay and purge need ``POST``, which is exactly what triggering a run of
  it needs. The audit actor is the Airflow user name.
- **CSRF**: the cookie is sent by the browser on its own, so state-changing calls must be
  ``Content-Type: application/json`` (a cross-site form cannot send that without a CORS preflight,
  which this app never grants) and must not come from another site (``Sec-Fetch-Site``).

Airflow's security module takes seconds to import and this module is imported by every Airflow
process that loads plugins, so it is imported on the first request, not here.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from retry_scheduler.airflow.hook import RetrySchedulerHook
from retry_scheduler.core.config import DEFAULT_DATABASE_URL
from retry_scheduler.db.connection import open_pool

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

#: The DAG whose permissions guard the page: its runs replay and purge dead jobs too.
DAG_ID = "dlq_replay"
#: How long the database URL read from the connection is reused.
URL_TTL_S = 30.0

bearer_scheme = HTTPBearer(auto_error=False)
_url_lock = threading.Lock()
_url_cache: tuple[float, str] | None = None


def database_url() -> str:
    """The retry database: the ``retry_postgres`` connection when defined, else ``RETRY_DATABASE_URL``.

    Read on the first request and again every :data:`URL_TTL_S` seconds, never at import.
    """
    global _url_cache
    with _url_lock:
        if _url_cache and time.monotonic() - _url_cache[0] < URL_TTL_S:
            return _url_cache[1]
        url = RetrySchedulerHook().database_url(in_task=False)
        if url is None:
            url = os.environ.get("RETRY_DATABASE_URL") or DEFAULT_DATABASE_URL
        _url_cache = (time.monotonic(), url)
        return url


#: The page's connections to the retry database: at most this many, whatever the number of requests
#: (``RETRY_WEB_POOL_SIZE``); a request waits up to ``POOL_WAIT_S`` for one, then gets 503.
POOL_SIZE = int(os.environ.get("RETRY_WEB_POOL_SIZE") or 4)
POOL_WAIT_S = 10.0
APPLICATION_NAME = "retry-scheduler-dead-letters"
_pools: dict[str, ConnectionPool] = {}
_pool_lock = threading.Lock()


def database() -> ConnectionPool:
    """The pool of the retry database (:func:`database_url`), made on first use and checked then.

    Every connection has the service's statement timeout; a URL that changed (the connection was
    edited) gets a new pool, and the old one is closed.
    """
    url = database_url()
    with _pool_lock:
        pool = _pools.get(url)
        if pool is None:
            pool = open_pool(url, size=POOL_SIZE, wait_s=POOL_WAIT_S, application_name=APPLICATION_NAME)
            for old in _pools.values():
                old.close(timeout=0)
            _pools.clear()
            _pools[url] = pool
        return pool


async def current_user(
    request: Request, bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
) -> Any:
    """The Airflow user of the request (bearer token, else the UI's cookie); 401/403 when none."""
    from airflow.api_fastapi.core_api.security import get_user

    return await get_user(request, _oauth_token=None, bearer_credentials=bearer)


def authorize(request: Request, user: Any, method: Literal["GET", "POST"]) -> None:
    """403 unless the auth manager lets ``user`` read (GET) or trigger (POST) ``dlq_replay`` runs."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag

    check = requires_access_dag(method=method, access_entity=DagAccessEntity.RUN, param_dag_id=DAG_ID)
    check(request, user)


def may(request: Request, user: Any, method: Literal["GET", "POST"]) -> bool:
    """Whether :func:`authorize` lets ``user`` through (for the page and ``/api/me``)."""
    try:
        authorize(request, user, method)
    except HTTPException:
        return False
    return True


UserDep = Annotated[Any, Depends(current_user)]


def reader(request: Request, user: UserDep) -> Any:
    """Dependency of every read: a logged-in user who may see ``dlq_replay`` runs."""
    authorize(request, user, "GET")
    return user


def operator(request: Request, user: UserDep) -> Any:
    """Dependency of replay and purge: may trigger ``dlq_replay``, and the request is not forgeable."""
    authorize(request, user, "POST")
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise HTTPException(415, "send the request as JSON (Content-Type: application/json)")
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise HTTPException(403, "cross-site requests are refused")
    return user
