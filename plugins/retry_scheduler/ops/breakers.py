"""The destinations' breakers, by hand: listed, opened and closed (``retry-scheduler breakers``,
``status`` and the Dead letters page all call these; the publish round's gate is
:mod:`retry_scheduler.loops.breakers`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from retry_scheduler.core.policy import PolicyRegistry
from retry_scheduler.db.breakers import BreakerRecords, BreakerStatus
from retry_scheduler.db.dead_letters import Database, connection
from retry_scheduler.db.queue import Queue
from retry_scheduler.db.store import Store


def list_breakers(
    database: Database, destinations: Sequence[str] = (), *, declared_in: PolicyRegistry | None = None
) -> list[BreakerStatus]:
    """Every breaker not closed or with jobs still paused, and those of ``destinations``; with
    ``declared_in``, also every destination jobs were stored for that has a breaker declared there.
    On a connection of its own, or the page's pool."""
    with connection(database) as conn:
        wanted = list(destinations)
        if declared_in is not None:
            wanted += [d for d in Queue(conn).known_destinations() if declared_in.has_breaker(d)]
        return BreakerRecords(conn).statuses(wanted)


def set_breakers(
    database_url: str,
    destinations: Sequence[str],
    state: Literal["open", "closed"],
    *,
    why: str,
    who: str,
    existing_only: bool = False,
) -> list[str]:
    """Open or close the breakers of ``destinations`` by hand (open: their due jobs paused until closed,
    no probe; closed: their paused jobs go now); ``existing_only``: only those with a breaker row already
    (a name from a request makes no row). The destinations set."""
    with Store(database_url) as store:
        if existing_only:
            known = {b.destination for b in store.breakers.statuses(destinations)}
            destinations = sorted(known & set(destinations))
        return store.breakers.set_states(destinations, state, why, who)
