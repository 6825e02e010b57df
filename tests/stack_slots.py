"""How many dev stacks the tests run at once on this machine, whatever the number of pytest-xdist workers.

A dev stack (scheduler, dag processor, triggerer, api-server, the executor's task processes, the
service's loops and ingest workers) holds up to about 30 PostgreSQL connections while its DAG runs
overlap (sampled: 19 to 31, the Celery stacks the most). Four at once (a random order can deal the
Celery, signals, capacity and held-snapshot stacks to the four workers together) took a server with
``max_connections = 100`` to its limit, and the next test to connect failed with "sorry, too many
clients already". So every stack first takes one of :func:`slot_count` slots: a lock file under
:data:`SLOTS_DIR`, machine-wide (two suites on one machine share the server too), released by
:func:`release` or when its process dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import IO

#: The lock files, one per slot; machine-wide, as the PostgreSQL server is.
SLOTS_DIR = Path(os.environ.get("RETRY_TEST_STACK_SLOTS_DIR") or "/tmp/retry-scheduler-test-stacks")
#: What a stack's connections are counted as (the most sampled, rounded up).
CONNECTIONS_PER_STACK = 30
#: What the tests themselves keep beside the stacks (each worker's fixtures, Spark's JDBC readers).
CONNECTIONS_BESIDE = 10
#: The longest a stack waits for a slot: the longest test that holds one takes a few minutes.
WAIT_S = 1800.0


def slot_count(max_connections: int, override: str | None = None) -> int:
    """How many stacks fit a server with ``max_connections`` (at least one); ``override``: the
    ``RETRY_TEST_STACK_SLOTS`` setting, which wins when set."""
    if override:
        return max(1, int(override))
    return max(1, (max_connections - CONNECTIONS_BESIDE) // CONNECTIONS_PER_STACK)


def acquire(slots: int, what: str, *, wait_s: float = WAIT_S, poll_s: float = 0.2) -> IO[str]:
    """Take a free slot of ``slots`` (waiting up to ``wait_s``); returns the open lock file, whose
    closing (:func:`release`, or the process's end) frees it. ``what`` is written into it, for
    whoever looks at who holds the slots."""
    SLOTS_DIR.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    while True:
        for index in range(slots):
            handle = open(SLOTS_DIR / f"slot-{index}", "a+")  # noqa: SIM115 (held until release)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            handle.truncate(0)
            handle.write(f"{os.getpid()} {what}\n")
            handle.flush()
            return handle
        if time.monotonic() > deadline:
            holders = ", ".join(
                (SLOTS_DIR / f"slot-{i}").read_text().strip() or "?"
                for i in range(slots)
                if (SLOTS_DIR / f"slot-{i}").exists()
            )
            raise TimeoutError(
                f"no dev stack slot of {slots} was free for {wait_s:.0f} s (held by: {holders}); "
                f"set RETRY_TEST_STACK_SLOTS to allow more stacks at once, if PostgreSQL allows the connections"
            )
        time.sleep(poll_s)


def release(handle: IO[str] | None) -> None:
    """Free a slot :func:`acquire` gave (nothing when ``handle`` is None or already closed)."""
    if handle is not None and not handle.closed:
        with contextlib.suppress(OSError):
            fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
