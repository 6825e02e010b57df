"""A dead-letter operation is checked when it is made: every way in (the CLI, the page, the DAG) gets
the same refusal, in the same words, before anything is read or written."""

from __future__ import annotations

import pytest

from retry_scheduler.core.jobs import Status
from retry_scheduler.db.selection import Selection
from retry_scheduler.ops.dlq import DEFAULT_REPLAY_RATE, UNPACED_UP_TO, DlqError, Operation, parse_rate


def op(**changes: object) -> Operation:
    fields: dict[str, object] = {
        "action": "replay", "selection": Selection(), "actor": "ann", "source": "cli", "dry_run": True,
    }  # fmt: skip
    return Operation(**{**fields, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"action": "delete"}, "action 'delete' must be replay, purge or reevaluate"),
        ({"actor": ""}, "an operation needs an actor"),
        ({"selection": Selection(status=Status.PENDING)}, "select dead jobs, not pending ones"),
        ({"action": "purge", "reset_attempts": True}, "reset_attempts applies to replay only"),
        ({"action": "reevaluate", "reset_attempts": True}, "reset_attempts does not go with reevaluate"),
        ({"action": "purge", "rate_per_s": 10}, "a rate applies to replay only"),
        ({"rate_per_s": -1}, "rate '-1' must be jobs per second per destination, from 0"),
        ({"rate_per_s": "fast"}, "rate 'fast' must be"),
        ({"rate_per_s": float("nan")}, "rate 'nan' must be"),
        ({"rate_per_s": float("inf")}, "rate 'inf' must be"),
        ({"rate_per_s": 10**9}, "rate '1000000000' must be"),
        ({"rate_per_s": True}, "rate 'True' must be"),
        ({"rate_per_s": "1" * 500}, "rate '1111111111111111111111111111111111111111' must be"),
    ],
)
def test_an_operation_that_cannot_be_done_is_refused_when_made(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(DlqError, match=message):
        op(**changes)


def test_the_operations_that_can_be_done_are_made() -> None:
    assert op(reset_attempts=True).reset_attempts
    assert op(action="purge", max_affected=10).max_affected == 10
    assert op(action="reevaluate", run_id="manual__1").run_id == "manual__1"


@pytest.mark.parametrize(
    ("given", "rate"),
    [(None, None), ("", None), ("unlimited", 0.0), ("0", 0.0), (0, 0.0), ("250", 250.0), (2.5, 2.5)],
)
def test_a_rate_is_read_as_forms_and_command_lines_give_it(given: object, rate: float | None) -> None:
    assert parse_rate(given) == rate


def test_the_pace_is_the_rate_asked_or_the_default_for_a_large_replay() -> None:
    small, large = {"a": UNPACED_UP_TO, "b": 3}, {"a": 5, "b": UNPACED_UP_TO + 1}
    assert (op().pace(small), op().pace(large)) == (None, DEFAULT_REPLAY_RATE)
    assert (op(rate_per_s=0).pace(large), op(rate_per_s=7).pace(small)) == (None, 7.0)


def test_a_replay_s_pace_and_its_destinations_rate_limits_are_said_without_contradiction() -> None:
    """A replay not paced of its own but with a rate-limited destination was said to be "not paced:
    every job due at once ... payments at most 20/s (its rate limit)"."""
    from retry_scheduler.ops.outcome import Outcome

    def said(**pace: object) -> str:
        outcome = Outcome(
            action="replay",
            dry_run=True,
            filter={},
            matched=30,
            would_affect=30,
            affected=0,
            audit_id=7,
            **pace,
        )  # type: ignore[arg-type]
        return outcome.summary()

    limited = said(rate_per_s=None, rate_limited={"payments": 20.0})
    assert "not paced" not in limited
    assert (
        "; paced only by the destinations' rate limits (payments at most 20/s); every other job due at once"
        in limited
    )
    below = said(rate_per_s=100.0, paced_s=0.3, rate_limited={"payments": 20.0})
    assert "; paced at 100 jobs/s per destination" in below
    assert "; payments at most 20/s (their rate limits, below the pace)" in below
    assert "; not paced: every job due at once [audit 7]" in said(rate_per_s=None)


def test_the_audit_s_text_says_the_approval_the_stop_and_a_run_not_finished() -> None:
    """``dlq audit`` without ``--json`` hid them, although the docs send operators there for them."""
    from retry_scheduler.cli.dlq import _audit_details

    row = {"dry_run": True, "approval": "approved", "approved_by": "bob", "watch": None, "finished_at": None}
    assert _audit_details(row) == "approval approved by bob"
    row = {"dry_run": False, "approval": "rejected", "approved_by": "carol", "finished_at": "2026-12-06"}
    assert _audit_details(row) == "approval rejected by carol"
    watched = {"dry_run": False, "watch": {"canary": 5}, "published": 5, "came_back": 5,
               "stopped": "the canary failed", "rate_per_s": 200.0, "finished_at": None}  # fmt: skip
    assert _audit_details(watched) == (
        "watched: 5 published, 5 came back; STOPPED: the canary failed; paced at 200/s; "
        "not finished (still running, or interrupted)"
    )
    assert _audit_details({"dry_run": True}) == ""
