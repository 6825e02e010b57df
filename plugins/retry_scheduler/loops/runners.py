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
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.metrics import Metrics
from retry_scheduler.db.connection import StoreError, connect, database_lost
from retry_scheduler.db.store import Store
from retry_scheduler.loops.counts import IngestCounts, PublishCounts, RunCounts
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

    ``metrics``: where batches are reported (the DAG passes Airflow's metrics layer). A database lost
    on the way (a failover) is connected to again (:func:`reconnecting`)."""
    settings = deployment.settings
    files = ", ".join(map(str, settings.policies_files))
    log.info("policies from %s: %s", files, ", ".join(sorted(deployment.policies.policies)))
    counts = IngestCounts()

    def ingest(seconds: float, terminated: Callable[[], bool]) -> None:
        with Store(settings.database_url) as store:
            ingestor = Ingestor(deployment, store, metrics=metrics)
            try:
                ingestor.run(seconds, should_stop=terminated)
            finally:
                counts.add(ingestor.totals)
                ingestor.close()

    with loop_title("ingest"), until_terminated("ingest") as terminated:
        reconnecting("ingest", settings.database_url, loop_seconds, ingest, terminated, counts)
    result = counts.as_dict()
    log.info(
        "ingest run summary: %s records read, %s stored, %s duplicates, %s pending, dead %s, in %s batches; "
        "slowest batch %.3f s (%s records)%s", counts.consumed, counts.stored, counts.duplicates, counts.pending,
        dict(counts.dead) or "none", counts.batches, counts.slowest_batch_s, counts.slowest_batch_records,
        f"; reconnected {counts.reconnects} times" if counts.reconnects else "",
    )  # fmt: skip
    return result


def run_publish(
    loop_seconds: float, deployment: Deployment, metrics: Metrics | None = None
) -> dict[str, Any]:
    """Publish due and dead jobs for ``loop_seconds``; returns the counts (a task pushes them as XCom).

    ``metrics``: where rounds, backlog and lateness are reported (the DAG passes Airflow's). A
    database lost on the way (a failover) is connected to again (:func:`reconnecting`): the round it
    held rolls back, and its jobs, published or not, are claimed again (a copy a destination got
    twice carries the same ``retry.id`` and ``retry.attempt``)."""
    settings = deployment.settings
    counts = PublishCounts()

    def publish(seconds: float, terminated: Callable[[], bool]) -> None:
        with Store(settings.database_url) as store:
            publisher = Publisher(deployment, store, metrics=metrics)
            try:
                publisher.run(seconds, should_stop=terminated)
            finally:
                for each in (publisher, *publisher.helpers):
                    counts.add(each.totals)
                publisher.close()

    with loop_title("publish"), until_terminated("publish") as terminated:
        reconnecting("publish", settings.database_url, loop_seconds, publish, terminated, counts)
    result = counts.as_dict()
    # Lateness of what was published while this loop ran (its helpers and the other publish tasks of
    # the run included): one read of the published_at index, not a count of the table.
    with Store(settings.database_url) as store:
        late = store.readings.lateness(window_s=int(loop_seconds) + 60)
    result.update(
        lateness_p50_s=late.p50_s, lateness_p99_s=late.p99_s, lateness_max_s=late.max_s, early=late.early
    )
    log.info(
        "publish run summary: %s claimed, %s published, %s to DLQ, %s failed %s; lateness p50 %s s, p99 %s s, "
        "%s early; slowest round %.3f s (%s jobs)%s", counts.claimed, counts.published, counts.dead_published,
        counts.failed, counts.errors or "", late.p50_s, late.p99_s, late.early, counts.slowest_round_s,
        counts.slowest_round_jobs, f"; reconnected {counts.reconnects} times" if counts.reconnects else "",
    )  # fmt: skip
    return result


#: After losing its database a loop connects again every RECONNECT_FIRST_S, doubling up to RECONNECT_MAX_S.
RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 5.0


def reconnecting(
    kind: str,
    database_url: str,
    loop_seconds: float,
    run: Callable[[float, Callable[[], bool]], None],
    terminated: Callable[[], bool],
    counts: RunCounts,
) -> None:
    """``run(seconds, should_stop)`` for ``loop_seconds``, started again whenever it ends because the
    database went away (:func:`~retry_scheduler.db.connection.database_lost`: a failover, a restart,
    a server that ended a transaction held too long), once a connection can be made again, for the
    time left. Every other error ends the loop, as does a database that does not come back in time.

    A loop starts over from what the database holds: the ingest plans its partitions from the
    offsets PostgreSQL stored, which a promoted replica may hold older than the ones committed to
    Kafka (the last commits lost): the records in between are read again rather than skipped.
    """
    deadline = time.monotonic() + loop_seconds
    pause = RECONNECT_FIRST_S
    while True:
        began = time.monotonic()
        try:
            run(max(0.0, deadline - began), terminated)
            return
        except Exception as exc:
            if not database_lost(exc) or terminated():
                raise
            text = str(exc).strip()
            log.warning(
                "%s loop: lost the database (%s: %s); connecting again to go on from what it holds%s",
                kind, type(exc).__name__, text.splitlines()[0] if text else "",
                _STANDBY_HINT if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction) else "",
            )  # fmt: skip
            if time.monotonic() - began > 2 * RECONNECT_MAX_S:
                pause = RECONNECT_FIRST_S  # it ran a while since the last loss: a new one
            _wait_for_database(kind, database_url, deadline, terminated, exc, pause)
            pause = min(RECONNECT_MAX_S, pause * 2)  # lost again at once: wait longer next time
            counts.reconnects += 1


#: Said when the server connected to takes no writes: the URL lacks what finds the primary.
_STANDBY_HINT = (
    " (the server is a standby: name every server in RETRY_DATABASE_URL with "
    "target_session_attrs=read-write, and a new connection finds the primary)"
)


def _wait_for_database(
    kind: str,
    database_url: str,
    deadline: float,
    terminated: Callable[[], bool],
    lost: Exception,
    pause: float,
) -> None:
    """Return once a connection to ``database_url`` is made, trying after ``pause`` seconds and then
    twice as long each time, up to RECONNECT_MAX_S (its libpq settings choose the server:
    ``target_session_attrs=read-write`` finds the primary among its hosts); raise ``lost`` when the
    loop's time runs out first or the task is stopped."""
    since = time.monotonic()
    while True:
        if time.monotonic() + pause >= deadline or terminated():
            raise lost
        time.sleep(pause)
        try:
            connect(database_url, statement_timeout=0).close()
        except StoreError as exc:
            if not database_lost(exc):
                raise
            pause = min(RECONNECT_MAX_S, pause * 2)
            continue
        log.warning("%s loop: connected again after %.1f s", kind, time.monotonic() - since)
        return
