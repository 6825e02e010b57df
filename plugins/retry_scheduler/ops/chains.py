"""Ordered mode's held chains, by hand: listed, and released as if their heads had died
(``retry-scheduler chains`` and the Dead letters page both call these)."""

from __future__ import annotations

from collections.abc import Sequence

from retry_scheduler.db.chains import HeldChain, Released, held_chains, release_chains
from retry_scheduler.db.dead_letters import Database, connection
from retry_scheduler.db.store import Store


def list_chains(database: Database, *, limit: int, stuck: bool = False) -> list[HeldChain]:
    """The chains holding records, the longest waiting first (``stuck``: only those whose head the
    scheduler does not hold); on a connection of its own, or the page's pool."""
    with connection(database) as conn:
        return held_chains(conn, limit=limit, stuck=stuck)


def release(database_url: str, chains: Sequence[str], *, why: str, actor: str, source: str) -> Released:
    """Release ``chains`` as if their heads had died, audited as ``actor``'s through ``source``
    (``cli``, ``ui``): their heads' pending retries dead, their first held records due."""
    with Store(database_url) as store:
        return release_chains(store.queue, chains, why=why, actor=actor, source=source)
