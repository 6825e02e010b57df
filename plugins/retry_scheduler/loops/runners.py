"""The loops run for a while, as a task or the ``run`` command runs them: titled, stopped by SIGTERM
after the work in hand, and summed up in one log line.

The ``retry_scheduler`` DAG's tasks (:mod:`retry_scheduler.airflow.tasks`) and ``retry-scheduler
run`` call these with the deployment (:class:`~retry_scheduler.core.deployment.Deployment`) they read.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.metrics import Metrics
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


def run_ingest(loop_seconds: float, deployment: Deployment, metrics: Metrics | None = None) -> dict[str, Any]:
    """Ingest the retry topics for ``loop_seconds``; returns the counts (a task pushes them as XCom).

    ``metrics``: where batches are reported (the DAG passes Airflow's metrics layer)."""
    settings = deployment.settings
    files = ", ".join(map(str, settings.policies_files))
    log.info("policies from %s: %s", files, ", ".join(sorted(deployment.policies.policies)))
    with (
        loop_title("ingest"),
        Store(settings.database_url) as store,
        until_terminated("ingest") as terminated,
    ):
        ingestor = Ingestor(deployment, store, metrics=metrics)
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
    loop_seconds: float, deployment: Deployment, metrics: Metrics | None = None
) -> dict[str, Any]:
    """Publish due and dead jobs for ``loop_seconds``; returns the counts (a task pushes them as XCom).

    ``metrics``: where rounds, backlog and lateness are reported (the DAG passes Airflow's)."""
    settings = deployment.settings
    with (
        loop_title("publish"),
        Store(settings.database_url) as store,
        until_terminated("publish") as terminated,
    ):
        publisher = Publisher(deployment, store, metrics=metrics)
        try:
            counts = publisher.run(loop_seconds, should_stop=terminated)
        finally:
            publisher.close()
        result = counts.as_dict()
        # Lateness of what was published while this loop ran (its helpers and the other publish
        # tasks of the run included): one read of the published_at index, not a count of the table.
        late = store.readings.lateness(window_s=int(loop_seconds) + 60)
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
