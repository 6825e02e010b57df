"""A gate of the publish round is a few lines: a made-up per-destination setting (a field of a
``Destination`` subclass) and the gate that applies it, run by the real publish loop against
PostgreSQL and Kafka beside the deployment's own gates."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from retry_scheduler import Destination
from retry_scheduler.core.declarations import DestinationRules
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.jobs import OutgoingRow
from retry_scheduler.core.metrics import NoMetrics
from retry_scheduler.core.policy import PolicyRegistry
from retry_scheduler.db.store import Store
from retry_scheduler.loops.gates import Gate, deployment_gates
from retry_scheduler.loops.publish import Publisher
from tests.integration.test_fair_publish import _FLOOD
from tests.integration.test_loop import new_loop
from tests.kafkautil import consume, create_topics

pytestmark = pytest.mark.integration


# The whole of a new setting: one field ...
@dataclasses.dataclass(frozen=True)
class Freezable(Destination):
    frozen: bool | None = None


# ... and one gate.
class FreezeGate:
    counts_as = "frozen"

    def __init__(self, rules: Callable[[str], DestinationRules], store: Store) -> None:
        self.rules, self.store = rules, store

    def apply(self, rows: list[OutgoingRow]) -> tuple[list[OutgoingRow], int]:
        frozen = [r for r in rows if r.destination and self.rules(r.destination).value("frozen")]
        self.store.slots.defer_jobs([(r.id, datetime.now(UTC) + timedelta(hours=1)) for r in frozen])
        kept = {r.id for r in frozen}
        return [r for r in rows if r.id not in kept], len(frozen)

    def after(self, rows: Sequence[OutgoingRow], acked: object, failed: object) -> None:
        pass

    def tick(self) -> None:
        pass


def test_a_made_up_gate_keeps_its_destinations_jobs_and_the_others_go(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    base = new_loop(database_url, bootstrap_servers, topic_prefix)
    frozen, other = f"{base.dest}.frozen", base.dest
    create_topics(base.bootstrap, [frozen, other])
    registry = PolicyRegistry.of(
        base.registry.policies.values(),
        [Freezable(f"{base.dest}.*", frozen=True, rate_limit=1000), Freezable(other)],
    )
    assert registry.rules(frozen).value("frozen") and not registry.rules(other).value("frozen")
    deployment = Deployment(base.settings, registry)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(_FLOOD, {"dest": frozen, "count": 10})
        conn.execute(_FLOOD.replace("'flood'", "'other'"), {"dest": other, "count": 10})

    def gates(store: Store) -> list[Gate]:
        return [*deployment_gates(deployment, store, metrics=NoMetrics()), FreezeGate(registry.rules, store)]

    with Store(database_url) as store:
        publisher = Publisher(deployment, store, gates=gates)
        try:
            counts = publisher.run(3, grace_s=0)
        finally:
            publisher.close()
    assert (counts.published, counts.gated) == (10, {"frozen": 10}), counts
    assert counts.as_dict()["gated"] == {"frozen": 10}
    assert len(consume(base.bootstrap, [other], 10)) == 10
    with psycopg.connect(database_url) as conn:
        kept = conn.execute(
            "SELECT status, attempt, due_at > now() + interval '50 minutes' FROM retry_jobs "
            "WHERE destination = %s",
            (frozen,),
        ).fetchall()
        gone = conn.execute("SELECT count(*) FROM retry_published_jobs WHERE destination = %s", (frozen,))
        assert gone.fetchone() == (0,)
    # Kept back as the gate said: pending, their attempt unspent, due an hour later (never earlier).
    assert kept == [("pending", 1, True)] * 10
