"""A destination's breaker (``BREAKERS``): its declaration and how it moves, a pure function of its row
and the time (the loop's part is tests/integration/test_breakers.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from retry_scheduler.core.breakers import (
    CLOSED,
    LET_ALL_GO,
    LET_PROBE_OUT,
    OPEN,
    PROBING,
    Breaker,
    BreakerRow,
    step,
)
from retry_scheduler.core.policy import DEFAULT, PolicyError, PolicyRegistry, load_policies

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
B = Breaker(failure_rate=0.5, min_records=10, window="1m", cool_down="30s", probe_window="20s")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def row(**kw: object) -> BreakerRow:
    return replace(BreakerRow("payments", window_at=T0), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("sent", "failed", "came_back", "opens"),
    [
        (10, 0, 5, True),  # half came back: at the share
        (5, 5, 0, True),  # half not delivered (10 tried)
        (8, 2, 3, True),  # 10 tried, 5 bad
        (10, 0, 4, False),  # below the share
        (8, 0, 8, False),  # every one back, but fewer than min_records sent
        (0, 0, 0, False),
        (10, 0, 30, True),  # more back than sent in the window (sent before it): still opens
    ],
)
def test_a_closed_breaker_opens_at_its_share_over_at_least_min_records(
    sent: int, failed: int, came_back: int, opens: bool
) -> None:
    new, action = step(row(sent=sent, failed=failed, came_back=came_back), B, at(10))
    assert action is None
    assert (new.state == OPEN) is opens
    if opens:
        assert (new.since, new.trips, new.sent, new.came_back) == (at(10), 1, 0, 0)
        assert new.reason is not None and "at least 50% opens the breaker" in new.reason


def test_the_window_slides_the_previous_window_counts_for_what_is_left_of_it() -> None:
    # 20 sent and 8 back in the window before; 15 s into the next, 75 % of it counts: 15 sent, 6 back.
    before = row(sent=20, came_back=8, window_at=at(-60))
    rolled, _ = step(before, B, at(15))
    assert (rolled.state, rolled.window_at, rolled.prev_sent, rolled.prev_came_back, rolled.sent) == (
        CLOSED, at(0), 20, 8, 0
    )  # fmt: skip
    # Two more come back now: 8 of 15, past the share.
    assert step(replace(rolled, came_back=2), B, at(15))[0].state == OPEN
    # 45 s in, only a quarter of the old window counts: 5 sent, fewer than min_records.
    assert step(replace(rolled, came_back=2), B, at(45))[0].state == CLOSED
    # Two windows later nothing of the old counts is left.
    old = step(row(sent=100, came_back=100, window_at=at(-130)), B, at(0))[0]
    assert (old.state, old.prev_sent, old.sent, old.window_at) == (CLOSED, 0, 0, at(0))


def test_open_it_waits_its_cool_down_then_lets_one_probe_out() -> None:
    opened = row(state=OPEN, since=at(0), trips=1, reason="why")
    assert step(opened, B, at(29)) == (opened, None)
    probing, action = step(opened, B, at(30))
    assert (probing.state, action, probing.probe_job, probing.reason) == (PROBING, LET_PROBE_OUT, None, "why")
    # Nothing was held to send as the probe: the next tick asks again.
    assert step(probing, B, at(31)) == (probing, LET_PROBE_OUT)


def test_opened_by_hand_it_stays_open_without_a_probe() -> None:
    by_hand = row(state=OPEN, since=at(0), by="cli:ann")
    assert step(by_hand, B, at(3600)) == (by_hand, None)


def test_a_probe_that_stays_away_closes_the_breaker_and_its_held_jobs_go() -> None:
    sent = row(state=PROBING, since=at(30), probe_job=7, probe_retry_id="r7", probe_at=at(30), trips=1)
    assert step(sent, B, at(45)) == (sent, None)  # not published yet, still in its window
    published = replace(sent, probe_published_at=at(31))
    assert step(published, B, at(50)) == (published, None)  # 19 s away
    closed, action = step(published, B, at(51))
    assert (closed.state, action, closed.since, closed.probe_job, closed.trips) == (
        CLOSED,
        LET_ALL_GO,
        at(51),
        None,
        1,
    )


def test_a_probe_that_comes_back_or_is_not_delivered_opens_it_again() -> None:
    sent = row(state=PROBING, since=at(30), probe_job=7, probe_retry_id="r7", probe_at=at(30), trips=1)
    back, action = step(replace(sent, probe_published_at=at(31), probe_came_back=True), B, at(35))
    assert (back.state, action, back.since, back.trips, back.probe_job) == (OPEN, None, at(35), 2, None)
    assert back.reason == "the probe r7 came back: its consumer failed it again"
    lost, _ = step(replace(sent, probe_error="delivery failed: Broker: Message too large"), B, at(50))
    assert (lost.state, lost.trips) == (OPEN, 2)
    assert lost.reason == "the probe r7 was not delivered: delivery failed: Broker: Message too large"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"failure_rate": 0}, "failure_rate=0: give a share above 0 and at most 1"),
        ({"failure_rate": 1.5}, "failure_rate=1.5"),
        ({"failure_rate": True}, "failure_rate=True"),
        ({"min_records": 0}, "min_records=0: give a whole number of records, at least 1"),
        ({"min_records": 2.5}, "min_records=2.5"),
        ({"window": "soon"}, "window: duration 'soon' is not like"),
        ({"cool_down": "100ms"}, "cool_down='100ms': give at least 1s"),
        ({"probe_window": -1}, "probe_window: duration -1 must be a finite number"),
    ],
)
def test_a_wrong_breaker_says_which_field_and_what_to_give(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        Breaker(**kwargs)


def test_a_destination_gets_its_own_breaker_else_the_most_specific_glob_that_matches() -> None:
    own, shop = Breaker(min_records=5), Breaker(min_records=50)
    registry = PolicyRegistry.of([DEFAULT], breakers={"shop.*": shop, "shop.orders": own})
    assert registry.breaker("shop.orders") is own
    assert registry.breaker("shop.cart") is shop
    assert registry.breaker("payments") is None and registry.has_breaker("shop.cart")
    assert not PolicyRegistry.of([DEFAULT]).declarations.any("breaker")
    # Between globs, the one with the most characters besides its '*' wins, whatever their order.
    narrow = Breaker(min_records=7)
    registry = PolicyRegistry.of([DEFAULT], breakers={"shop.*": shop, "shop.or*": narrow})
    assert registry.breaker("shop.orders") is narrow and registry.breaker("shop.cart") is shop


def test_the_policies_module_declares_breakers_and_a_wrong_one_is_one_clear_line(tmp_path: Path) -> None:
    module = tmp_path / "retry_policies.py"
    module.write_text(
        "from retry_scheduler.core.breakers import Breaker\nfrom retry_scheduler.core.policy import Policy\n"
        "POLICIES = [Policy('default', delays=['1s'], max_attempts=3)]\n"
        "BREAKERS = {'payments': Breaker(failure_rate=0.25)}\n"
    )
    assert load_policies(module).breaker("payments") == Breaker(failure_rate=0.25)
    module.write_text(
        "from retry_scheduler.core.policy import Policy\n"
        "POLICIES = [Policy('default', delays=['1s'], max_attempts=3)]\nBREAKERS = {'payments': 0.5}\n"
    )
    with pytest.raises(
        PolicyError, match=r"BREAKERS\['payments'\]: breaker is a float: write Breaker\(failure_rate=0.5"
    ):
        load_policies(module)
    module.write_text(
        "from retry_scheduler.core.breakers import Breaker\nfrom retry_scheduler.core.policy import Policy\n"
        "POLICIES = [Policy('default', delays=['1s'], max_attempts=3)]\nBREAKERS = {'payments': Breaker(cool_down='0s')}\n"
    )
    with pytest.raises(PolicyError, match=r"retry_policies.py, line 4: cool_down='0s': give at least 1s$"):
        load_policies(module)
    module.write_text(
        "from retry_scheduler.core.policy import Policy\n"
        "POLICIES = [Policy('default', delays=['1s'], max_attempts=3)]\nBREAKERS = ['payments']\n"
    )
    with pytest.raises(PolicyError, match="BREAKERS must be a dict of destination"):
        load_policies(module)
