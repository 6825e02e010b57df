"""Loops whose time is up keep going until a newer loop of their kind is alive."""

from __future__ import annotations

import psycopg
import pytest

from retry_scheduler.db.store import Store
from retry_scheduler.loops.handover import LoopTenure

pytestmark = pytest.mark.integration


def test_a_loop_past_its_time_carries_on_until_relieved(database_url: str) -> None:
    with Store(database_url) as store:
        old = LoopTenure(store, "publish", duration_s=0, grace_s=300)
        assert old.go_on(), "nobody else is alive: the loop must not leave the jobs unpublished"
        LoopTenure(store, "ingest", duration_s=60, grace_s=0)  # another kind does not relieve it
        assert old.go_on()
        new = LoopTenure(store, "publish", duration_s=60, grace_s=0)
        assert not old.go_on(), "a newer publish loop is alive: the old one may stop"
        assert new.go_on()  # the newer one is within its own time
        old.finish()
        new.finish()
        with psycopg.connect(database_url) as conn:
            assert conn.execute("SELECT kind FROM retry_loops").fetchall() == [("ingest",)]


def test_a_dead_successor_does_not_relieve(database_url: str) -> None:
    with Store(database_url) as store:
        old = LoopTenure(store, "publish", duration_s=0, grace_s=300)
        new = LoopTenure(store, "publish", duration_s=60, grace_s=0)
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE retry_loops SET heartbeat_at = now() - interval '1 minute' WHERE worker = %s",
                (new.worker,),
            )
        assert old.go_on(), "the newer loop stopped heartbeating: it is not alive"


def test_grace_bounds_the_extension(database_url: str) -> None:
    with Store(database_url) as store:
        assert not LoopTenure(store, "ingest", duration_s=0, grace_s=0).go_on()
