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
