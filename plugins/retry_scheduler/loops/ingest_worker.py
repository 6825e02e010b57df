"""The ingest loop's worker processes, the loop's side: starting them (ahead of a handover, too),
sharing the partitions among them, gathering their counts, ending unused ones.

With ``RETRY_INGEST_WORKERS`` above 1 the loop that holds the retry topics shares their partitions
among worker processes (:meth:`retry_scheduler.loops.ingest.Ingestor.run`); each runs
:func:`retry_scheduler.loops.ingest_process.worker_main`, fed its work pickled on stdin.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

import retry_scheduler

log = logging.getLogger(__name__)

#: Where ``retry_scheduler`` is imported from: put on a worker process's PYTHONPATH.
_PACKAGE_ROOT = Path(retry_scheduler.__file__).resolve().parents[1]
#: A loop waiting for the retry topics starts its worker processes this long into the wait, one
#: every SPARES_APART_S (:meth:`retry_scheduler.loops.ingest.Ingestor.run`).
SPARES_AFTER_S = 5.0
SPARES_APART_S = 1.0


#: A worker's exit status when its database went away (:func:`~retry_scheduler.db.connection.database_lost`).
LOST_DATABASE_EXIT = 75


class IngestWorkerError(RuntimeError):
    """An ingest worker process died; the loop stops so that a new one starts from the stored offsets.

    ``lost_database``: it died because the database went away; the loop then connects again and goes
    on (:func:`~retry_scheduler.loops.runners.reconnecting`)."""

    def __init__(self, message: str, *, lost_database: bool = False) -> None:
        super().__init__(message)
        self.lost_database = lost_database


def spawn_worker() -> subprocess.Popen[bytes]:
    """A worker process (``python -c``, so that nothing of the loop's ``__main__`` is run again), its
    imports done, waiting on stdin for its work (:func:`start_worker`); it exits if none comes."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-c", "from retry_scheduler.loops.ingest_process import worker_main; worker_main()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )


def end_unused(spares: list[subprocess.Popen[bytes]]) -> None:
    """End worker processes that were started ahead and got no work: at the end of their input they
    exit at once."""
    while spares:
        proc = spares.pop()
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


#: A share of the partitions: (topic, partition, the offset to start from).
Share = list[tuple[str, int, int]]


def run_workers(
    plan: Share,
    workers: int,
    go_on: Callable[[], bool],
    spares: list[subprocess.Popen[bytes]] | None,
    *,
    work: Callable[[Share, str], bytes],
    on_counts: Callable[[dict[str, Any]], None],
    partitions: Callable[[], list[tuple[str, int]]],
) -> None:
    """Ingest ``plan``'s partitions in ``workers`` processes until ``go_on()`` says no or the retry
    topics' partitions (``partitions()``) change (then the caller plans again). A worker that dies
    stops them all. ``work(share, name)``: what a worker is given on its stdin; ``on_counts``: each
    stored batch's counts, as a worker reports them. ``spares``: processes started ahead
    (:func:`spawn_worker`), taken from the list first."""
    spares = spares if spares is not None else []
    shares = [plan[i::workers] for i in range(min(workers, len(plan)))]
    results: queue.Queue[dict[str, Any]] = queue.Queue()
    procs = [
        start_worker(work(share, f"ingest-worker-{n}"), n, results, spares.pop() if spares else None)
        for n, share in enumerate(shares, start=1)
    ]
    end_unused(spares)
    log.info("ingesting %s partitions in %s worker processes", len(plan), len(procs))
    planned = {(t, p) for t, p, _ in plan}
    checked = time.monotonic()
    try:
        while go_on():
            _collect(results, 0.2, on_counts)
            ended = [(n, proc.returncode) for n, proc in enumerate(procs, start=1) if proc.poll() is not None]
            failed = next(((n, code) for n, code in ended if code != 0), None)
            if failed is not None:
                n, code = failed
                raise IngestWorkerError(
                    f"ingest-worker-{n} exited with code {code}"
                    + (" (it lost the database)" if code == LOST_DATABASE_EXIT else "")
                    + ": stopping the ingest loop (the next one starts from the offsets stored with the rows)",
                    lost_database=code == LOST_DATABASE_EXIT,
                )
            if ended:  # stopped by SIGTERM after the batch in hand: the others stop too, then plan again
                log.info("ingest-worker-%s was asked to stop (SIGTERM): stopping the workers", ended[0][0])
                break
            if time.monotonic() - checked > 10:
                checked = time.monotonic()
                try:
                    now = set(partitions())
                except KafkaException as exc:  # a broker frozen or failing over: the shares stand
                    log.warning(
                        "the retry topics' partitions could not be listed (%s): looking again in 10 s", exc
                    )
                    continue
                if now != planned:
                    log.info("the retry topics changed: sharing their partitions again")
                    break
    finally:
        for proc in procs:  # end of input: each worker stops after the batch in hand
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _collect(results, 0, on_counts)


def start_worker(
    work: bytes,
    n: int,
    results: queue.Queue[dict[str, Any]],
    proc: subprocess.Popen[bytes] | None = None,
) -> subprocess.Popen[bytes]:
    """Give a worker process (``proc``, else a new one) its ``work`` on its stdin; its counts come out
    as JSON lines, into ``results``."""
    if proc is None or proc.poll() is not None:  # none started ahead, or it was stopped meanwhile
        proc = spawn_worker()
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(work)
    proc.stdin.flush()
    lines = proc.stdout

    def relay() -> None:
        for line in lines:
            try:
                results.put(json.loads(line))
            except ValueError:  # something else wrote to the worker's stdout
                log.warning("ingest-worker-%s: %s", n, line.decode(errors="replace").rstrip())

    threading.Thread(target=relay, name=f"ingest-worker-{n}-counts", daemon=True).start()
    return proc


def _collect(
    results: queue.Queue[dict[str, Any]], wait_s: float, on_counts: Callable[[dict[str, Any]], None]
) -> None:
    try:
        counts = results.get(timeout=wait_s) if wait_s else results.get_nowait()
        while True:
            on_counts(counts)
            counts = results.get_nowait()
    except queue.Empty:
        pass
