"""The gates of a publish round: what may keep a claimed job from going out now.

A round claims due jobs, then passes them through each gate in turn, in the round's transaction
(its claim's locks held). A gate lets some through and keeps the others back (pauses them, or makes
them due later), pending with their attempts unspent; it says how many it kept. After the round
commits, each gate hears what was delivered and what failed; every loop pass, it may move its own
state (``tick``). A gate reads the rules of each job's destination
(:meth:`~retry_scheduler.core.policy.PolicyRegistry.rules`), resolved once per destination, never a
setting of its own.

The deployment's gates, in order: the destinations' breakers (:mod:`retry_scheduler.loops.breakers`),
then their rate limits (:mod:`retry_scheduler.loops.rate_limits`). A gate whose rule no declaration
sets costs a round nothing. A new per-destination setting that the publish round applies is a field
of :class:`~retry_scheduler.core.declarations.Destination` and one module with a class like these.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.jobs import OutgoingRow
from retry_scheduler.core.metrics import Metrics
from retry_scheduler.db.store import Store
from retry_scheduler.loops.breakers import DestinationBreakers
from retry_scheduler.loops.rate_limits import DestinationRateLimits


class Gate(Protocol):
    """One gate of the publish round (see the module)."""

    #: What its kept-back jobs are counted as in the round's counts (``paused``, ``deferred``, or a name
    #: of its own, counted under ``PublishCounts.gated``).
    counts_as: str

    def apply(self, rows: list[OutgoingRow]) -> tuple[list[OutgoingRow], int]:
        """The claimed ``rows`` that may go out now, and how many it kept back; in the round's
        transaction."""
        ...

    def after(
        self, rows: Sequence[OutgoingRow], acked: Sequence[tuple[int, int]], failed: Sequence[tuple[int, str]]
    ) -> None:
        """After the round committed: the rows it let through, those delivered and those failed."""
        ...

    def tick(self) -> None:
        """Once a loop pass (not in its helpers): move the gate's own state."""
        ...


def deployment_gates(
    deployment: Deployment, store: Store, *, clock: Callable[[], float] = time.time, metrics: Metrics
) -> list[Gate]:
    """The deployment's gates, in the order a round applies them: breakers, then rate limits."""
    registry = deployment.policies
    return [
        DestinationBreakers(
            registry.rules,
            store.breakers,
            store.queue,
            any_breaker=registry.any("breaker"),
            clock=clock,
            metrics=metrics,
        ),
        DestinationRateLimits(registry.rules, store.slots, any_limit=registry.any("rate_limit")),
    ]
