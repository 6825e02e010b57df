"""The Dead letters page: a FastAPI app the Airflow api-server serves at ``/retry-scheduler/``.

Registered by :mod:`retry_scheduler.airflow.plugin`. The page (``static/index.html`` + vanilla JS and
CSS, no build step, nothing from the internet) talks to the JSON API under ``/retry-scheduler/api/``,
which is a thin layer over :mod:`retry_scheduler.ops.dlq`.

Who may read and act, and the database the page reads: :mod:`retry_scheduler.airflow.webui.access`.
"""

from __future__ import annotations

import logging
import time
import uuid
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials
from psycopg_pool import PoolTimeout
from pydantic import BaseModel, ConfigDict, Field

from retry_scheduler.airflow.hook import with_airflow_policies
from retry_scheduler.airflow.webui.access import (
    DAG_ID,
    UserDep,
    bearer_scheme,
    current_user,
    database,
    database_url,
    may,
    operator,
    reader,
)
from retry_scheduler.core import adopt
from retry_scheduler.core.config import ConfigError, Settings
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.policy import PolicyError
from retry_scheduler.db import selection
from retry_scheduler.db.connection import StoreError
from retry_scheduler.ops import browse, dlq

log = logging.getLogger(__name__)

#: Where the api-server mounts this app (retry_scheduler.airflow.plugin).
PREFIX = "/retry-scheduler"
#: The page's files, installed with the package.
STATIC_DIR = Path(str(resources.files("retry_scheduler.airflow.webui").joinpath("static")))
STATIC_TYPES = {
    "app.js": "text/javascript",
    "app.css": "text/css",
    "icon.svg": "image/svg+xml",
}
# Scripts, styles and images from this app only (no inline script: data can never become code);
# framed only by Airflow's own UI, which shows the page in its navigation.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class ActionBody(BaseModel):
    """A replay or purge: the filter (as on the list), or ``ids``; a dry run unless said otherwise."""

    model_config = ConfigDict(extra="forbid")

    destination: str | None = None
    dead_reason: str | None = None
    error_class: str | None = None
    search: str | None = None
    since: str | None = None
    until: str | None = None
    #: who wrote the letters: ``retry-scheduler`` or an adopted topic's format (``ops.dlq.WRITERS``)
    written_by: str | None = None
    ids: Annotated[list[int], Field(max_length=selection.MAX_IDS)] = []
    limit: Annotated[int | None, Field(ge=1, le=selection.MAX_LIMIT)] = None
    reset_attempts: bool = False
    #: a replay's pace, jobs per second per destination (0: none; empty: the default, ``ops.dlq``)
    rate: Annotated[float | None, Field(ge=0, le=dlq.MAX_RATE)] = None
    dry_run: bool = True


app = FastAPI(
    title="Dead letters",
    description="Browse, replay and purge the dead jobs of kafka-retry-scheduler.",
    docs_url=None,
    redoc_url=None,
    openapi_url=None,  # served below, to logged-in users only
)


@app.exception_handler(selection.SelectionError)
async def _bad_request(request: Request, exc: selection.SelectionError) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=422)


@app.exception_handler(PoolTimeout)
async def _busy(request: Request, exc: PoolTimeout) -> JSONResponse:
    log.warning("dead letters: every connection of the page is busy (%s)", exc)
    return JSONResponse(
        {
            "detail": "The Dead letters page is busy (every one of its database connections is in use): try again."
        },
        status_code=503,
        headers={"Retry-After": "5"},
    )


@app.exception_handler(StoreError)
async def _no_database(request: Request, exc: StoreError) -> JSONResponse:
    log.error("dead letters: %s", exc)
    return JSONResponse({"detail": str(exc)}, status_code=503)


@app.exception_handler(ConfigError)
@app.exception_handler(PolicyError)
async def _misconfigured(request: Request, exc: Exception) -> JSONResponse:
    """The deployment's configuration (its policies module, say) cannot be read: said, not a 500."""
    log.error("dead letters: %s", exc)
    return JSONResponse({"detail": str(exc)}, status_code=503)


@app.middleware("http")
async def _headers(request: Request, call_next: Any) -> Response:
    response: Response = await call_next(request)
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def _forbidden_page(user: Any) -> HTMLResponse:
    name = str(user.get_name()).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return HTMLResponse(
        "<!doctype html><title>Dead letters</title><h1>Dead letters</h1>"
        f"<p>{name}, you are not allowed to see the runs of the {DAG_ID} DAG, so not its dead letters "
        "either. Ask an Airflow admin.</p>",
        status_code=403,
    )


@app.get("/", include_in_schema=False)
async def page(
    request: Request, bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
) -> Response:
    """The page; without a login, Airflow's login page with a way back here."""
    try:
        user = await current_user(request, bearer)
    except HTTPException as exc:
        if exc.status_code not in (401, 403):
            raise
        from airflow.api_fastapi.app import get_auth_manager

        return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)))
    if not await run_in_threadpool(may, request, user, "GET"):
        return _forbidden_page(user)
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")


@app.get("/static/{name}", include_in_schema=False)
def static(name: str, user: UserDep) -> FileResponse:
    if name not in STATIC_TYPES:
        raise HTTPException(404, "no such file")
    return FileResponse(STATIC_DIR / name, media_type=STATIC_TYPES[name])


@app.get("/api/openapi.json", include_in_schema=False)
def openapi(user: Annotated[Any, Depends(reader)]) -> dict[str, Any]:
    return app.openapi()


@app.get("/api/me")
def me(request: Request, user: Annotated[Any, Depends(reader)]) -> dict[str, Any]:
    """Who is logged in and whether they may replay and purge."""
    return {
        "user": user.get_name(),
        "can_operate": may(request, user, "POST"),
        "dag_id": DAG_ID,
        "count_cap": browse.COUNT_CAP,
        "show_bytes": browse.SHOW_BYTES,
        "max_page": browse.MAX_PAGE,
    }


@app.get("/api/dead-letters")
def dead_letters(
    user: Annotated[Any, Depends(reader)],
    destination: str | None = None,
    dead_reason: str | None = None,
    error_class: str | None = None,
    search: str | None = None,
    since: str | None = None,
    until: str | None = None,
    written_by: str | None = None,
    cursor: str | None = None,
    page_size: Annotated[int, Query(ge=1, le=browse.MAX_PAGE)] = 50,
    count: bool = True,
) -> dict[str, Any]:
    """Dead jobs newest first, a page at a time: pass the previous page's ``next_cursor`` for the next.

    ``total`` is capped (``total_capped``); ``count=false`` skips it (-1) when paging one filter. Each
    job says who wrote it (``written_by``: this service, or the tool of the dead-letter topic it was
    read from), and ``written_by`` filters on it.
    """
    settings = Settings.from_env()
    flt = selection.Selection.from_params(
        {
            "destination": destination,
            "dead_reason": dead_reason,
            "error_class": error_class,
            "search": search,
            "since": since,
            "until": until,
            "written_by": written_by,
        },
        settings,
    )
    page = browse.list_dead(
        database(), flt, page_size=page_size, cursor=cursor, count=count, settings=settings
    )
    return page.as_json()


@app.get("/api/writers")
def writers(user: Annotated[Any, Depends(reader)]) -> list[str]:
    """Who may have written a dead letter here: this service and the tools whose dead-letter topics are
    adopted (the page's "Written by" menu)."""
    settings = Settings.from_env()
    adopted = {adopt.source_format(spec) for spec in settings.adopt_topics.values()}
    return [writer for writer in adopt.WRITERS if writer == adopt.SERVICE or writer in adopted]


@app.get("/api/dead-letters/{job_id}")
def dead_letter(request: Request, job_id: int, user: Annotated[Any, Depends(reader)]) -> dict[str, Any]:
    """Every field of one dead job; key, value and header values as ``{encoding, text, size, truncated}``.

    Dead jobs only: a job that was replayed (pending, published) is not a dead letter any more, and
    this page's readers may not see the payloads of the service's other jobs (404, saying so).
    Payloads (key, value, header values) need the operator's permission (may trigger ``dlq_replay``
    runs): a reader who may only see the runs gets the metadata, ``payload_hidden`` true, and the
    sizes of what is hidden.
    """
    try:
        job = browse.show(database(), job_id)
    except dlq.DlqError as exc:  # the only one show() raises: no such job
        raise HTTPException(404, str(exc)) from None
    if job.get("status") != "dead":
        raise HTTPException(
            404, f"Job {job_id} is no longer dead: it is {job.get('status')}. This page shows dead jobs only."
        )
    job["payload_hidden"] = not may(request, user, "POST")
    if job["payload_hidden"]:
        job.update(key=_hidden(job["key"]), value=_hidden(job["value"]))
        job["headers"] = [{"name": h["name"], "value": _hidden(h["value"])} for h in job["headers"]]
    return job


def _hidden(rendered: dict[str, Any] | None) -> dict[str, Any] | None:
    """A payload part as a reader without the operator's permission sees it: its size, not its bytes."""
    if rendered is None:
        return None
    return {"encoding": "hidden", "text": "", "size": rendered["size"], "truncated": False}


@app.get("/api/facets")
def facets(user: Annotated[Any, Depends(reader)]) -> list[dict[str, Any]]:
    """Dead jobs per destination and dead reason (the filter menus)."""
    return browse.facets(database())


@app.get("/api/audit")
def audit(
    user: Annotated[Any, Depends(reader)], limit: Annotated[int, Query(ge=1, le=200)] = 20
) -> list[dict[str, Any]]:
    """The latest replays and purges (dry runs included), newest first."""
    return dlq.recent_audit(database(), limit)


def _act(request: Request, action: dlq.Action, body: ActionBody, user: Any) -> dict[str, Any]:
    params = body.model_dump(exclude={"reset_attempts", "dry_run", "rate"})
    settings = with_airflow_policies(Settings.from_env())
    flt = selection.Selection.from_params(params, settings)
    operation = dlq.Operation(
        action=action,
        selection=flt,
        actor=str(user.get_name()),
        source="ui",
        dry_run=body.dry_run,
        reset_attempts=body.reset_attempts,
        max_affected=dlq.MAX_PAGE_ACTION,
        rate_per_s=body.rate,
    )
    # A purge needs no policies: a policies module that does not load does not stop it.
    deployment = None if action == "purge" else Deployment.load(settings)
    try:
        outcome = dlq.run_action(database(), operation, deployment=deployment)
    except dlq.TooManyForOneRequest as too_many:
        return hand_to_dag(request, operation, user, too_many.would_affect, body.written_by)
    log.info("dead letters page, %s: %s", user.get_name(), outcome.summary())
    # page_limit: the most this page changes in one request; more are handed to a dlq_replay run.
    return {**outcome.as_json(), "summary": outcome.summary(), "page_limit": dlq.MAX_PAGE_ACTION}


def hand_to_dag(
    request: Request,
    operation: dlq.Operation,
    user: Any,
    would_affect: int,
    written_by: str | None = None,
) -> dict[str, Any]:
    """Trigger a ``dlq_replay`` run for an operation too large for one request; its id and link.

    The run does the work in batches with its own log, retries and audit row (actor: this user, as
    the run's triggering user). It is created as the REST API would create it, by the user who
    already passed the check for triggering ``dlq_replay`` runs (:func:`operator`).
    """
    import inspect
    from urllib.parse import quote

    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.exceptions import DagNotFound
    from airflow.models.dag import DagModel
    from airflow.utils.types import DagRunTriggeredByType

    # The run's form takes who wrote the letters, not topics: it finds them as this page did.
    action = operation.action
    conf: dict[str, Any] = {
        **{k: v for k, v in operation.selection.as_dict().items() if k != "source_topics"},
        **({"written_by": written_by} if written_by else {}),
        "action": action,
        "reset_attempts": operation.reset_attempts,
        **({"rate": operation.rate_per_s} if operation.rate_per_s is not None else {}),
        "dry_run": False,
    }
    if "ids" in conf:  # the DAG's form takes ids as text, as typed
        conf["ids"] = ",".join(map(str, conf["ids"]))
    run_id = f"dead_letters_page__{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}_{uuid.uuid4().hex[:8]}"
    name = str(user.get_name())
    wanted: dict[str, Any] = {
        "triggered_by": DagRunTriggeredByType.REST_API,
        "run_id": run_id,
        "conf": conf,
        "triggering_user_name": name,
    }
    accepted = inspect.signature(trigger_dag).parameters  # Airflow 3.1 to 3.3
    try:
        trigger_dag(DAG_ID, **{k: v for k, v in wanted.items() if k in accepted})
    except DagNotFound:
        raise dlq.DlqError(
            f"{would_affect:,} jobs is more than this page {action}s at once, and the {DAG_ID} DAG that "
            "would do it is not in Airflow's database yet: check that its file is in the DAGs folder "
            "and parses (airflow dags list-import-errors)"
        ) from None
    except ValueError as exc:  # the DAG's Params refused the conf (ParamValidationError), or its run type
        raise dlq.DlqError(f"the {DAG_ID} DAG refused this run: {exc}") from None
    model = DagModel.get_dagmodel(DAG_ID)
    paused = bool(model and model.is_paused)
    root = request.scope.get("root_path", "").removesuffix(PREFIX)
    url = f"{root}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}"
    summary = (
        f"{would_affect:,} jobs is more than this page {action}s at once: {DAG_ID} run {run_id} does it"
        + (f" once the {DAG_ID} DAG is unpaused" if paused else "")
    )
    log.info("dead letters page, %s: %s (filter %s)", name, summary, conf)
    return {
        "action": action,
        "handed_to_dag": True,
        "would_affect": would_affect,
        "dag_id": DAG_ID,
        "dag_run_id": run_id,
        "dag_run_url": url,
        "dag_paused": paused,
        "summary": summary,
    }


class ChainsBody(BaseModel):
    """A release of chains (ordered mode): their ids (``GET /api/chains``) and a note."""

    model_config = ConfigDict(extra="forbid")

    chains: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=200)]], Field(min_length=1, max_length=100)
    ]
    why: Annotated[str, Field(max_length=500)] = ""


@app.get("/api/chains")
def chains(
    user: Annotated[Any, Depends(reader)],
    stuck: bool = False,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[dict[str, Any]]:
    """Ordered mode's chains with records waiting, the longest waiting first (``stuck``: only those
    whose head the scheduler no longer has)."""
    from retry_scheduler.ops.chains import list_chains

    # the page's pool: a few connections whatever the load
    found = list_chains(database(), limit=limit, stuck=stuck)
    return [c.as_dict() for c in found]


@app.post("/api/chains/release")
def release_chains(
    request: Request, body: ChainsBody, user: Annotated[Any, Depends(operator)]
) -> dict[str, Any]:
    """Let chains go as if their heads had died (``retry-scheduler chains release``); audited."""
    from retry_scheduler.ops.chains import release

    why = "its chain was released by an operator" + (f" ({body.why.strip()})" if body.why.strip() else "")
    done = release(database_url(), body.chains, why=why, actor=str(user.get_name()), source="ui")
    log.info("dead letters page, %s released chains %s", user.get_name(), done.chains)
    return {"released": done.chains, "heads_dead": done.heads_dead, "not_waiting": done.unknown}


class BreakersBody(BaseModel):
    """Close breakers by hand: their paused jobs go at once, without a probe."""

    model_config = ConfigDict(extra="forbid")

    destinations: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=249)]], Field(min_length=1, max_length=100)
    ]
    why: Annotated[str, Field(max_length=500)] = ""


@app.get("/api/breakers")
def breakers(user: Annotated[Any, Depends(reader)]) -> list[dict[str, Any]]:
    """The destinations' breakers not closed or with jobs still paused (``BREAKERS``)."""
    from retry_scheduler.ops.breakers import list_breakers

    return [b.as_dict() for b in list_breakers(database())]


@app.post("/api/breakers/close")
def close_breakers(body: BreakersBody, user: Annotated[Any, Depends(operator)]) -> dict[str, Any]:
    """Close breakers by hand (``retry-scheduler breakers close``): their paused jobs go at once."""
    from retry_scheduler.ops.breakers import set_breakers

    who = str(user.get_name())
    why = f"closed by {who} on the dead letters page" + (f": {body.why.strip()}" if body.why.strip() else "")
    done = set_breakers(database_url(), body.destinations, "closed", why=why, who=who, existing_only=True)
    log.info("dead letters page, %s closed breakers %s", who, done)
    return {"closed": done, "unknown": sorted(set(body.destinations) - set(done))}


@app.post("/api/reevaluate")
def reevaluate(request: Request, body: ActionBody, user: Annotated[Any, Depends(operator)]) -> dict[str, Any]:
    """Read the selected dead ``invalid`` jobs again against the current policies (a dry run unless
    ``dry_run`` is false): those that pass become pending with their original bytes. More than
    ``MAX_PAGE_ACTION`` candidates are handed to a ``dlq_replay`` run instead (``handed_to_dag``)."""
    return _act(request, "reevaluate", body, user)


@app.post("/api/replay")
def replay(request: Request, body: ActionBody, user: Annotated[Any, Depends(operator)]) -> dict[str, Any]:
    """Make the selected dead jobs due now (``dry_run`` defaults to true: say ``false`` to act).

    More than ``MAX_PAGE_ACTION`` jobs are handed to a ``dlq_replay`` run instead (``handed_to_dag``).
    """
    return _act(request, "replay", body, user)


@app.post("/api/purge")
def purge(request: Request, body: ActionBody, user: Annotated[Any, Depends(operator)]) -> dict[str, Any]:
    """Delete the selected dead jobs already on their DLQ topic (``dry_run`` defaults to true).

    More than ``MAX_PAGE_ACTION`` jobs are handed to a ``dlq_replay`` run instead (``handed_to_dag``).
    """
    return _act(request, "purge", body, user)
