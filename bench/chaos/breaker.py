"""Trials of a destination's breaker: the publish loop killed (-9) while it pauses jobs or lets them go.

The trial's destination has a breaker (``CHAOS_BREAKER``: bench/chaos_policies.py), opened by hand
before the workload arrives, so that every job falling due is paused; a while later it is closed by hand,
and the paused jobs go. The publish worker's fault plan kills it:

* ``kill_breaker_paused``: in the N-th round that paused jobs, before that round committed (the jobs stay
  due, and are paused again by the next process);
* ``kill_breaker_let_go``: in the tick that lets the paused jobs go once the breaker is closed, before it
  committed (they stay paused, and the next process lets them go).

The trial's count is the others': every record on its destination (or its DLQ) at least once, never
early, with the attempt it had before it was paused (a paused job spends none), copies identified.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from bench.chaos.stack import Worker

BREAKER_FAULTS = ("kill_breaker_paused", "kill_breaker_let_go")
#: What the workers' environment gains in a breaker trial.
BREAKER_ENV = {"CHAOS_BREAKER": "1"}


def plan_breaker_fault(fault: str, rng: random.Random, records: int) -> tuple[dict[str, Any], dict[str, str]]:
    """The trial's parameters and the publish worker's fault plan."""
    detail: dict[str, Any] = {
        "held_at_least": rng.randint(1, max(1, records // 4)),
        "hold_s": round(rng.uniform(0.5, 3.0), 3),
    }
    if fault == "kill_breaker_paused":
        detail.update(checkpoint="publish.paused", n=rng.randint(1, 3))
    else:
        detail.update(checkpoint="breaker.let_go", n=1)
    return detail, {"publish": f"{detail['checkpoint']}:{detail['n']}"}


def _held(database_url: str, destination: str) -> int:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM retry_breaker_holds WHERE destination = %s", [destination]
        ).fetchone()
    return int(row[0]) if row else 0


def hold(database_url: str, destination: str) -> None:
    """Open the destination's breaker by hand (before the workload): every job falling due is held."""
    from retry_scheduler.db.store import Store

    with Store(database_url) as store:
        store.breakers.set_states([destination], "open", "chaos: its consumer is down", "chaos")


def closer(
    detail: dict[str, Any], workers: dict[str, Worker], database_url: str, destination: str
) -> Callable[[], None]:
    """The body of the thread that closes the breaker, once enough jobs are held (and, for a kill
    while holding, once the publish worker was killed and started again)."""

    def strike() -> None:
        from retry_scheduler.db.store import Store

        began = time.monotonic()
        deadline = began + 45
        while detail["checkpoint"] == "publish.paused" and workers["publish"].starts < 2:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        while _held(database_url, destination) < detail["held_at_least"] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(detail["hold_s"])
        detail["held_when_closed"] = _held(database_url, destination)
        with Store(database_url) as store:
            store.breakers.set_states([destination], "closed", "chaos: its consumer is back", "chaos")
        detail["closed_at_s"] = round(time.monotonic() - began, 3)

    return strike
