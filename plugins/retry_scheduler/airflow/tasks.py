"""The bodies of the DAGs' Python tasks: the loops, the DLQ operations, the monitor check.

The DAG definitions (:mod:`retry_scheduler.airflow.dags`) call these. Settings come from the
service's connections through :class:`~retry_scheduler.airflow.hook.RetrySchedulerHook`, read when
the task runs.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from retry_scheduler.airflow.hook import settings_from_connections
from retry_scheduler.core.config import Settings
from retry_scheduler.core.metrics import Metrics
from retry_scheduler.core.policy import load_policies
from retry_scheduler.db.store import Store
from retry_scheduler.loops.ingest import Ingestor
from retry_scheduler.loops.publish import Publisher

log = logging.getLogger(__name__)


@contextlib.contextmanager
def until_terminated(kind: str) -> Iterator[Callable[[], bool]]:
    """``should_stop`` for a loop run as a task: true once the task's process was sent SIGTERM.

    A pod being deleted, an operator's ``kill`` and ``dev up``'s Ctrl-C end a task with SIGTERM, on
    which Airflow's task runner only calls ``on_kill``; a stopping scheduler (LocalExecutor) and a
    Celery worker's warm shutdown wait for their running tasks. The loop now ends after the batch or
    round in hand (its rows and offsets committed, the jobs the broker acknowledged marked) rather
    than running out its ``loop_seconds`` (90 s) or being killed half-way through a round. The
    handler that was there before still runs. Outside the main thread (the ``run`` command's loops)
    signals cannot be caught: the loop never stops early.
    """
    terminated = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield terminated.is_set
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        terminated.set()
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield terminated.is_set
    finally:
        signal.signal(signal.SIGTERM, previous)
        if terminated.is_set():
            log.warning(
                "%s loop: stopped early, after the work in hand, because the task was sent SIGTERM", kind
            )


@contextlib.contextmanager
def loop_title(kind: str) -> Iterator[None]:
    """Name the task's process after its loop while it runs (``ps`` shows ``... retry-scheduler ingest
    loop``): Airflow titles a task runner with the task instance's id only, and an operator (or the
    benchmark's CPU budget) tells the two loops apart by this. The title is put back afterwards."""
    try:
        import setproctitle
    except ImportError:  # an Airflow dependency; without it the title stays
        yield
        return
    before = setproctitle.getproctitle()
    setproctitle.setproctitle(f"{before} retry-scheduler {kind} loop")
    try:
        yield
    finally:
        setproctitle.setproctitle(before)


def run_ingest(
    loop_seconds: float, settings: Settings | None = None, metrics: Metrics | None = None
) -> dict[str, Any]:
    """Ingest the retry topics for ``loop_seconds``; returns the counts (pushed as XCom).

    ``metrics``: where batches are reported (the DAG passes Airflow's metrics layer)."""
    settings = settings or settings_from_connections()
    registry = load_policies(settings.policies_file)
    log.info("policies from %s: %s", settings.policies_file, ", ".join(sorted(registry.policies)))
    with (
        loop_title("ingest"),
        Store(settings.database_url) as store,
        until_terminated("ingest") as terminated,
    ):
        ingestor = Ingestor(settings, registry, store, metrics=metrics)
        try:
            counts = ingestor.run(loop_seconds, should_stop=terminated)
        finally:
            ingestor.close()
    result = counts.as_dict()
    log.info(
        "ingest run summary: %s records read, %s stored, %s duplicates, %s pending, dead %s, in %s batches; "
        "slowest batch %.3f s (%s records)", counts.consumed, counts.stored, counts.duplicates, counts.pending,
        dict(counts.dead) or "none", counts.batches, counts.slowest_batch_s, counts.slowest_batch_records,
    )  # fmt: skip
    return result


def run_publish(
    loop_seconds: float, settings: Settings | None = None, metrics: Metrics | None = None
) -> dict[str, Any]:
    """Publish due and dead jobs for ``loop_seconds``; returns the counts (pushed as XCom).

    ``metrics``: where rounds, backlog and lateness are reported (the DAG passes Airflow's)."""
    settings = settings or settings_from_connections()
    with (
        loop_title("publish"),
        Store(settings.database_url) as store,
        until_terminated("publish") as terminated,
    ):
        publisher = Publisher(settings, store, metrics=metrics)
        try:
            counts = publisher.run(loop_seconds, should_stop=terminated)
        finally:
            publisher.close()
        result = counts.as_dict()
        # Lateness of what was published while this loop ran (its helpers and the other publish
        # tasks of the run included): one read of the published_at index, not a count of the table.
        late = store.lateness(window_s=int(loop_seconds) + 60)
        result.update(
            lateness_p50_s=late.p50_s, lateness_p99_s=late.p99_s, lateness_max_s=late.max_s, early=late.early
        )
    log.info(
        "publish run summary: %s claimed, %s published, %s to DLQ, %s failed %s; lateness p50 %s s, p99 %s s, "
        "%s early; slowest round %.3f s (%s jobs)", counts.claimed, counts.published, counts.dead_published,
        counts.failed, counts.errors or "", late.p50_s, late.p99_s, late.early, counts.slowest_round_s,
        counts.slowest_round_jobs,
    )  # fmt: skip
    return result


def run_dlq_operation(
    params: dict[str, Any], actor: str | None, run_id: str | None, settings: Settings | None = None
) -> dict[str, Any]:
    """The ``dlq_replay`` DAG's task: replay or purge the dead jobs of the form's filter, audited.

    ``actor`` is the Airflow user who triggered the run (recorded in ``retry_dlq_audit``);
    ``settings``: the deployment's (default: from the service's connections).
    """
    from retry_scheduler.core.records import deployment_destinations
    from retry_scheduler.db.selection import Selection
    from retry_scheduler.ops.dlq import run_action

    settings = settings or settings_from_connections()
    flt = Selection.from_params(params, settings)
    action = params.get("action", "replay")
    dry_run = bool(params.get("dry_run", True))

    def progress(done: int, total: int) -> None:
        log.info("%s: %d of %d jobs done", action, done, total)

    if action == "reevaluate":
        return _reevaluate(settings, flt, params, actor, run_id, dry_run, progress)
    outcome = run_action(
        settings.database_url,
        action,
        flt,
        actor=actor or "airflow",
        source="dag",
        dry_run=dry_run,
        reset_attempts=bool(params.get("reset_attempts", False)),
        run_id=run_id,
        progress=progress,
        destinations=deployment_destinations(settings),
    )
    log.info("%s", outcome.summary())
    if dry_run and outcome.would_affect:
        log.info("nothing was changed: trigger again with dry_run unticked to %s these jobs", action)
    return outcome.as_json()


def _reevaluate(
    settings: Settings,
    flt: Any,
    params: dict[str, Any],
    actor: str | None,
    run_id: str | None,
    dry_run: bool,
    progress: Callable[[int, int], None],
) -> dict[str, Any]:
    """``dlq_replay``'s action ``reevaluate``: the dead invalid jobs of the filter read again against
    the current policies (those that pass become pending), audited with the run's id."""
    from retry_scheduler.ops.reevaluate import reevaluate

    registry = load_policies(settings.policies_file)
    outcome = reevaluate(
        settings.database_url, flt, settings=settings, registry=registry, actor=actor or "airflow",
        source="dag", dry_run=dry_run, run_id=run_id, reset_attempts=bool(params.get("reset_attempts")),
        progress=progress,
    )  # fmt: skip
    log.info("%s", outcome.summary())
    if dry_run and outcome.would_affect:
        log.info("nothing was changed: trigger again with dry_run unticked to make these jobs pending")
    return outcome.as_json()


#: The form fields of ``dlq_window_replay`` that narrow its window; any other key of a run's conf is ignored.
WINDOW_FILTER = ("destination", "dead_reason", "error_class", "search", "written_by")


def run_window_replay(
    params: dict[str, Any],
    start: datetime | None,
    end: datetime | None,
    actor: str | None,
    run_id: str | None,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """The ``dlq_window_replay`` DAG's task: replay the dead jobs that went dead in ``[start, end)``.

    The window is the run's data interval and cannot be widened by the run's conf: only the
    :data:`WINDOW_FILTER` fields, ``reset_attempts`` and ``dry_run`` are taken from ``params``.
    """
    if start is None or end is None:
        raise ValueError(
            "dlq_window_replay replays a data interval: trigger it with a logical date, or backfill it"
        )
    window = {name: params.get(name) for name in WINDOW_FILTER}
    window.update(
        action="replay",
        since=start.isoformat(),
        until=end.isoformat(),
        reset_attempts=params.get("reset_attempts", False),
        dry_run=params.get("dry_run", True),
    )
    log.info("dead jobs that went dead from %s until %s", start.isoformat(), end.isoformat())
    return run_dlq_operation(window, actor, run_id, settings)


def record_replay(dag_id: str, run_id: str, action: str, settings: Settings | None = None) -> dict[str, Any]:
    """The ``record`` task of the replay DAGs: the run's audit row becomes the event of the
    ``retry_scheduler_replays`` asset. A dry run, or a run that replayed nothing, records no event
    (the task is skipped): a DAG scheduled on the asset runs only when jobs went back on their way."""
    from airflow.sdk import get_current_context
    from airflow.sdk.exceptions import AirflowSkipException

    from retry_scheduler.airflow.assets import replay_extra, replays_asset
    from retry_scheduler.ops.dlq import audit_of_run

    audit = audit_of_run((settings or settings_from_connections()).database_url, run_id, action)
    if audit is None:
        raise ValueError(f"no {action} audit row for run {run_id}: did the replay task run?")
    extra = replay_extra(dag_id, audit)
    if audit["dry_run"] or not audit["affected"]:
        raise AirflowSkipException(
            f"nothing replayed ({'dry run' if audit['dry_run'] else 'no job replayed'}): no asset event"
        )
    get_current_context()["outlet_events"][replays_asset()].extra = extra
    log.info("%d dead jobs replayed; asset %s updated", audit["affected"], replays_asset().name)
    return extra


def run_monitor_task(settings: Settings | None = None) -> dict[str, Any]:
    """The ``check`` task of the ``retry_monitor`` DAG: connections and the Variable read at run time
    (``settings``: the deployment's; default: from the service's connections)."""
    from airflow.sdk import Variable

    from retry_scheduler.airflow.notifiers import alert_notifiers
    from retry_scheduler.loops.offsets import ingest_lag
    from retry_scheduler.loops.sources import read_letters
    from retry_scheduler.ops.monitor import VARIABLE, Thresholds, run_monitor

    raw = Variable.get(VARIABLE, default=None)
    thresholds = Thresholds.from_json(raw if raw is None else str(raw))
    settings = settings or settings_from_connections()
    channels = alert_notifiers()
    return run_monitor(
        settings.database_url,
        thresholds,
        channels,
        lag=lambda store: ingest_lag(settings, store.ingest_offsets(settings.consumer_group)),
        letters=(lambda store: read_letters(settings, store)) if settings.adopt_topics else None,
    )
