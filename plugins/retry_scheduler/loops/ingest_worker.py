"""The ingest loop's worker processes: starting them (ahead of a handover, too) and ending unused ones.

With ``RETRY_INGEST_WORKERS`` above 1 the loop that holds the retry topics shares their partitions
among worker processes (:meth:`retry_scheduler.loops.ingest.Ingestor.run`); each runs
:func:`retry_scheduler.loops.ingest.worker_main`, fed its work pickled on stdin.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import retry_scheduler

#: Where ``retry_scheduler`` is imported from: put on a worker process's PYTHONPATH.
_PACKAGE_ROOT = Path(retry_scheduler.__file__).resolve().parents[1]
#: A loop waiting for the retry topics starts its worker processes this long into the wait, one
#: every SPARES_APART_S (:meth:`retry_scheduler.loops.ingest.Ingestor.run`).
SPARES_AFTER_S = 5.0
SPARES_APART_S = 1.0


class IngestWorkerError(RuntimeError):
    """An ingest worker process died; the loop stops so that a new one starts from the stored offsets."""


def spawn_worker() -> subprocess.Popen[bytes]:
    """A worker process (``python -c``, so that nothing of the loop's ``__main__`` is run again), its
    imports done, waiting on stdin for its work (``Ingestor._start_worker``); it exits if none comes."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-c", "from retry_scheduler.loops.ingest import worker_main; worker_main()"],
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
