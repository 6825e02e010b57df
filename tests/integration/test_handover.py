"""Loops whose time is up keep going until a newer loop of their kind is alive."""

from __future__ import annotations

import logging

import psycopg
import pytest

from retry_scheduler.cli.main import main
from retry_scheduler.db.store import Store
from retry_scheduler.loops.handover import LoopTenure

pytestmark = pytest.mark.integration


def test_a_loop_past_its_time_carries_on_until_relieved(database_url: str) -> None:
    with Store(database_url) as store:
        old = LoopTenure(store.loops, "publish", duration_s=0, grace_s=300)
        assert old.go_on(), "nobody else is alive: the loop must not leave the jobs unpublished"
        LoopTenure(store.loops, "ingest", duration_s=60, grace_s=0)  # another kind does not relieve it
        assert old.go_on()
        new = LoopTenure(store.loops, "publish", duration_s=60, grace_s=0)
        assert not old.go_on(), "a newer publish loop is alive: the old one may stop"
        assert new.go_on()  # the newer one is within its own time
        old.finish()
        new.finish()
        with psycopg.connect(database_url) as conn:
            assert conn.execute("SELECT kind FROM retry_loops").fetchall() == [("ingest",)]


def test_a_dead_successor_does_not_relieve(database_url: str) -> None:
    with Store(database_url) as store:
        old = LoopTenure(store.loops, "publish", duration_s=0, grace_s=300)
        new = LoopTenure(store.loops, "publish", duration_s=60, grace_s=0)
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE retry_loops SET heartbeat_at = now() - interval '1 minute' WHERE worker = %s",
                (new.worker,),
            )
        assert old.go_on(), "the newer loop stopped heartbeating: it is not alive"


def test_grace_bounds_the_extension(database_url: str) -> None:
    with Store(database_url) as store:
        assert not LoopTenure(store.loops, "ingest", duration_s=0, grace_s=0).go_on()


@pytest.mark.parametrize("grace", ["0", "1"])
def test_the_run_command_s_grace_says_how_long_its_loop_waits_for_a_successor(
    grace: str, database_url: str, bootstrap_servers: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Outside Airflow no next run relieves the loop: ``run --seconds 8`` used to take 68 s."""
    caplog.set_level(logging.INFO, logger="retry_scheduler.loops")
    code = main(
        ["--database-url", database_url, "--kafka-bootstrap", bootstrap_servers,
         "run", "--only", "publish", "--seconds", "1", "--grace", grace]
    )  # fmt: skip
    assert code == 0
    said = [r.getMessage() for r in caplog.records]
    carried_on = "publish loop: time is up but no newer loop is alive yet; carrying on" in said
    gave_up = "publish loop: no newer loop took over within the grace period; stopping" in said
    assert (carried_on, gave_up) == ((False, False) if grace == "0" else (True, True)), said
