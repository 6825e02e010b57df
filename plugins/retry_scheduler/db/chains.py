"""Ordered mode's chains, for the people who run the service: what waits, and letting it go.

A *chain* is the records of one key waiting behind their *head* (a failed record whose retry is
pending, or out at the consumer); docs/header-protocol.md, "Per-key ordering". A chain waits while
its head is pending here; one whose head the scheduler no longer has is *stuck* as far as it can
tell: the head's retry was published and its consumer has not released it (not running, not reading
that topic), or the head was lost (a dead head's row forgotten, a consumer that left ordered mode).

:func:`release_chains` lets chains go as if their heads had died: the head's retry, if still pending,
goes dead (to its DLQ topic, replayable), and the chain's records are published in their order with
``retry.chain-state: dead:<head>`` (``dead:*`` when the head is not known), so that the consumer
helper applies its ``after_dead`` (handle them, or dead-letter them). It serves ``retry-scheduler
chains release`` and the policies' ``max_age`` for waiting records (:func:`expire_chains`, run by the
publish loop).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from retry_scheduler.core import protocol
from retry_scheduler.db.queue import Queue
from retry_scheduler.db.readings import HELD_DUE_AT
from retry_scheduler.db.schema import q

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WaitingChain:
    """One chain with records waiting in it (:func:`waiting_chains`)."""

    chain: str
    destination: str | None
    key: bytes | None
    group: str | None
    #: Records waiting in it.
    waiting: int
    #: Seconds since its oldest waiting record was stored.
    waited_s: float
    #: The oldest first-seen time of its waiting records (epoch ms) and the policy of its first one.
    first_seen_ms: int
    policy: str | None
    #: blocked (waiting for ``head``), released or dead (going out), or None (no state: waiting).
    state: str | None
    head: str | None
    #: Whether the head's retry is pending here; a waiting chain whose head is not is stuck.
    head_pending: bool

    @property
    def stuck(self) -> bool:
        return self.state in (None, "blocked") and not self.head_pending

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["key"] = None if self.key is None else self.key.decode("utf-8", "backslashreplace")
        out["waited_s"] = round(self.waited_s, 3)
        out["stuck"] = self.stuck
        return out


def waiting_chains(
    conn: psycopg.Connection[Any],
    chains: Sequence[str] | None = None,
    limit: int = 100,
    *,
    stuck: bool = False,
) -> list[WaitingChain]:
    """The chains with records waiting (``chains``, or all; only the stuck ones with ``stuck``), the longest waiting
    first, at most ``limit``; read on ``conn`` (a store's, or a pool's: the Dead letters page)."""
    params = {"held_due": HELD_DUE_AT, "chains": None if chains is None else list(chains), "stuck": stuck}
    with conn.transaction():
        rows = conn.execute(q("waiting_chains"), {**params, "limit": limit}).fetchall()
    return [_waiting_chain(row) for row in rows]


def _waiting_chain(row: Any) -> WaitingChain:
    return WaitingChain(
        chain=row[0], destination=row[1], key=None if row[2] is None else bytes(row[2]), group=row[3],
        waiting=int(row[4]), waited_s=float(row[5]), first_seen_ms=int(row[6]), policy=row[7], state=row[8],
        head=row[9], head_pending=bool(row[10]),
    )  # fmt: skip


@dataclass(frozen=True)
class Released:
    """What :func:`release_chains` did: the chains released, and the heads' retries it made dead."""

    chains: list[str]
    heads_dead: list[str]
    #: Chains asked for that have nothing waiting (finished, going out already, or never were).
    unknown: list[str]


def release_chains(
    queue: Queue,
    chains: Sequence[str],
    *,
    why: str,
    dead_reason: str = "requested",
    actor: str | None = None,
    source: str = "cli",
) -> Released:
    """Release ``chains`` as if their heads had died (see the module), in one transaction: the heads'
    pending retries dead (``dead_reason``, ``why`` before their own reason), the chains' states dead
    with their heads (``*`` where unknown), their first waiting records due. Only waiting chains are
    released: one already going out (released, or its head dead) is left alone. With an ``actor`` (an
    operator's release) the transaction writes an audit row (``retry_dlq_audit``, ``release_chains``)."""
    wanted = sorted(set(chains))
    found = {
        c.chain: c
        for c in waiting_chains(queue.conn, wanted, limit=max(len(wanted), 1))
        if c.state in (None, "blocked")  # one going out already is left as it is
    }
    heads = {
        chain: (c.head if c.state == "blocked" and c.head else protocol.CHAIN_ANY_HEAD)
        for chain, c in found.items()
    }
    unknown = [chain for chain in wanted if chain not in found]
    with queue.conn.transaction():
        dead: list[str] = []
        if found:
            named = sorted({h for h in heads.values() if h != protocol.CHAIN_ANY_HEAD})
            params = {"heads": named, "dead_reason": dead_reason, "why": why}
            dead = sorted(row[0] for row in queue.conn.execute(q("give_up_heads"), params).fetchall())
            queue.advance_holds([], dead_chains=heads)
        if actor is not None:
            queue.conn.execute(
                q("chains_audit"),
                {"actor": actor, "source": source, "filter": Jsonb({"chains": wanted, "why": why}),
                 "matched": len(found), "affected": len(found), "skipped": Jsonb({"not_waiting": len(unknown)})},
            )  # fmt: skip
    if found:
        log.warning(
            "%s chain(s) released as if their heads had died (%s): %s", len(found), why, sorted(found)
        )
    return Released(sorted(found), dead, unknown)


def expire_chains(
    queue: Queue, max_age_ms: Mapping[str, int | None], now_ms: int, limit: int = 1000
) -> Released:
    """The policies' ``max_age`` for waiting records (``max_age_ms``: policy name -> milliseconds, None
    for no limit): a chain whose oldest waiting record was first seen longer ago than its policy allows is
    released as if its head had expired (its pending retry dead as ``expired``)."""
    old = [
        c.chain
        for c in waiting_chains(queue.conn, limit=limit)
        if c.state in (None, "blocked")
        and (limit_ms := max_age_ms.get(c.policy or "")) is not None
        and now_ms - c.first_seen_ms > limit_ms
    ]
    if not old:
        return Released([], [], [])
    return release_chains(queue, old, why="waited longer than its policy's max_age", dead_reason="expired")
