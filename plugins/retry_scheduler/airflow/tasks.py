"""The bodies of the DAGs' Python tasks: the loops, the DLQ operations, the monitor check.

The DAG definitions (:mod:`retry_scheduler.airflow.dags`) call these. Settings come from the
service's connections through :class:`~retry_scheduler.airflow.hook.RetrySchedulerHook`, read when
the task runs.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from retry_scheduler.airflow.hook import settings_from_connections
from retry_scheduler.core.config import Settings
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.metrics import Metrics

if TYPE_CHECKING:
    from retry_scheduler.ops.dlq import Approval, Operation

log = logging.getLogger(__name__)


def run_ingest(
    loop_seconds: float, settings: Settings | None = None, metrics: Metrics | None = None
) -> dict[str, Any]:
    """The ``ingest`` task: :func:`retry_scheduler.loops.runners.run_ingest` with the settings of the
    service's connections (unless given); its counts are pushed as XCom."""
    from retry_scheduler.loops import runners

    return runners.run_ingest(loop_seconds, Deployment.load(settings or settings_from_connections()), metrics)


def run_publish(
    loop_seconds: float, settings: Settings | None = None, metrics: Metrics | None = None
) -> dict[str, Any]:
    """The ``publish`` task: :func:`retry_scheduler.loops.runners.run_publish` with the settings of the
    service's connections (unless given); its counts are pushed as XCom."""
    from retry_scheduler.loops import runners

    return runners.run_publish(
        loop_seconds, Deployment.load(settings or settings_from_connections()), metrics
    )


def dlq_operation(
    params: dict[str, Any],
    actor: str | None,
    run_id: str | None,
    settings: Settings,
    approval: Approval | None = None,
) -> Operation:
    """The operation a replay DAG's form asks for; ``approval``: the approval gate's, which names the
    approver and bounds the replay to the oldest jobs its approver was shown."""
    from dataclasses import replace

    from retry_scheduler.db.selection import Selection
    from retry_scheduler.ops.dlq import Operation
    from retry_scheduler.ops.watch import Watch

    selection = Selection.from_params(params, settings)
    if approval is not None:
        # The oldest jobs the approver was shown: letters dead since are newer, not replayed.
        limit = approval.matched if selection.limit is None else min(selection.limit, approval.matched)
        selection = replace(selection, limit=max(1, limit))
    return Operation(
        action=params.get("action", "replay"),
        selection=selection,
        actor=actor or "airflow",
        source="dag",
        dry_run=bool(params.get("dry_run", True)),
        reset_attempts=bool(params.get("reset_attempts", False)),
        run_id=run_id,
        rate_per_s=params.get("rate"),
        watch=Watch.from_params(params),
        approved_by=None if approval is None else approval.by,
    )


def run_dlq_operation(
    params: dict[str, Any],
    actor: str | None,
    run_id: str | None,
    settings: Settings | None = None,
    approval: Approval | None = None,
) -> dict[str, Any]:
    """The ``dlq_replay`` DAG's task: replay or purge the dead jobs of the form's filter, audited.

    ``actor`` is the Airflow user who triggered the run (recorded in ``retry_dlq_audit``);
    ``settings``: the deployment's (default: from the service's connections); ``approval``: the
    approval gate's decision, when the run waited for one (:mod:`retry_scheduler.airflow.approval`).
    """
    from retry_scheduler.ops.dlq import run_action

    settings = settings or settings_from_connections()
    operation = dlq_operation(params, actor, run_id, settings, approval)
    action = operation.action

    def progress(done: int, total: int) -> None:
        log.info("%s: %d of %d jobs done", action, done, total)

    # A purge needs no policies: one that does not load does not stop it.
    deployment = None if action == "purge" else Deployment.load(settings)
    outcome = run_action(settings.database_url, operation, deployment=deployment, progress=progress)
    log.info("%s", outcome.summary())
    if operation.dry_run and outcome.would_affect:
        to_do = "make these jobs pending" if action == "reevaluate" else f"{action} these jobs"
        log.info("nothing was changed: trigger again with dry_run unticked to %s", to_do)
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
    :data:`WINDOW_FILTER` fields, ``reset_attempts``, ``rate``, the watch's (``canary``,
    ``verdict_window``, ``stop_above``) and ``dry_run`` are taken from ``params``.
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
        rate=params.get("rate"),
        canary=params.get("canary"),
        verdict_window=params.get("verdict_window"),
        stop_above=params.get("stop_above"),
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
        lag=lambda store: ingest_lag(settings, store.queue.ingest_offsets(settings.consumer_group)),
        letters=(lambda store: read_letters(settings, store)) if settings.adopt_topics else None,
    )
