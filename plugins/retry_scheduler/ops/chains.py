"""Ordered mode's chains, by hand: listed, and released as if their heads had died
(``retry-scheduler chains`` and the Dead letters page both call these)."""

from __future__ import annotations

from collections.abc import Sequence

from retry_scheduler.db.chains import Released, WaitingChain, release_chains, waiting_chains
from retry_scheduler.db.dead_letters import Database, connection
from retry_scheduler.db.store import Store


def list_chains(database: Database, *, limit: int, stuck: bool = False) -> list[WaitingChain]:
    """The chains with records waiting, the longest waiting first (``stuck``: only those whose head
    the scheduler no longer has); on a connection of its own, or the page's pool."""
    with connection(database) as conn:
        return waiting_chains(conn, limit=limit, stuck=stuck)


def release(database_url: str, chains: Sequence[str], *, why: str, actor: str, source: str) -> Released:
    """Release ``chains`` as if their heads had died, audited as ``actor``'s through ``source``
    (``cli``, ``ui``): their heads' pending retries dead, their first waiting records due."""
    with Store(database_url) as store:
        return release_chains(store.queue, chains, why=why, actor=actor, source=source)
