"""Fault injection for the chaos tests: named checkpoints where a process can be told to die.

The ingest and publish loops call :func:`checkpoint` at the points where a crash matters most
(``ingest.consumed``: a batch consumed, not yet stored; ``ingest.stored``: rows committed, offsets
not yet; ``publish.produced`` / ``publish.dlq_produced``: the broker acknowledged, the jobs are
not yet marked; ``publish.paused``: a round's jobs paused by their destination's open breaker, not yet
committed; ``breaker.let_go``: a closed breaker's paused jobs let go, not yet committed). So do the bulk
operations: ``bulk_retry.acked`` (a Spark partition handed a batch
of acknowledged jobs to be marked published, not yet committed), ``compaction.archived`` (the
archive written, synced and verified, nothing deleted yet), ``compaction.deleted`` (one more delete
batch committed), ``dlq.batch`` (a replay or purge batch changed, its transaction not yet
committed) and ``dlq.watch`` (a watched replay's wave made due and committed, its watch begun).

With ``RETRY_FAULT=NAME:N`` set (several: comma-separated), the process SIGKILLs itself the N-th
time it reaches checkpoint NAME: no cleanup, no ``finally``, like a power cut or the OOM killer. At
the bulk operations' checkpoints the whole job dies, not only the process that got there: every
process of its session (the command, ``spark-submit``'s JVM, the Python driver) and of its own
process group (Spark's Python workers have one), as when the machine running an Airflow task is
lost. Unset, a checkpoint costs one lookup in an empty dict. The variable is read once, at import.
"""

from __future__ import annotations

import contextlib
import os
import signal

ENV = "RETRY_FAULT"

#: Every checkpoint the service code calls; a plan naming another is a typo, refused loudly.
LOOP_CHECKPOINTS = frozenset(
    {
        "ingest.consumed",
        "ingest.stored",
        "publish.produced",
        "publish.dlq_produced",
        "publish.paused",
        "breaker.let_go",
    }
)
#: Checkpoints of the bulk operations, where the whole job dies (see the module's docstring).
JOB_CHECKPOINTS = frozenset(
    {"bulk_retry.acked", "compaction.archived", "compaction.deleted", "dlq.batch", "dlq.watch"}
)
CHECKPOINTS = LOOP_CHECKPOINTS | JOB_CHECKPOINTS


class FaultSpecError(ValueError):
    """``RETRY_FAULT`` is malformed or names an unknown checkpoint; the message says which."""


def parse(spec: str) -> dict[str, int]:
    """``"ingest.stored:3,publish.produced:1"`` -> ``{"ingest.stored": 3, "publish.produced": 1}``."""
    plan: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, count = item.rpartition(":")
        if not sep or not count.isdigit() or int(count) < 1:
            raise FaultSpecError(f"{ENV} entry {item!r} must look like CHECKPOINT:N with N >= 1")
        if name not in CHECKPOINTS:
            raise FaultSpecError(
                f"{ENV} names unknown checkpoint {name!r} (known: {', '.join(sorted(CHECKPOINTS))})"
            )
        plan[name] = int(count)
    return plan


_plan: dict[str, int] = parse(os.environ.get(ENV, ""))
_reached: dict[str, int] = {}


def checkpoint(name: str) -> None:
    """Die here (SIGKILL) if the fault plan says this is the N-th time; otherwise do nothing."""
    target = _plan.get(name)
    if target is None:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] < target:
        return
    if name in JOB_CHECKPOINTS:
        with contextlib.suppress(OSError):  # the session's group: not there when its leader is gone
            os.killpg(os.getsid(0), signal.SIGKILL)
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
