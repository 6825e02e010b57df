"""A dead-letter operation is checked when it is made: every way in (the CLI, the page, the DAG) gets
the same refusal, in the same words, before anything is read or written."""

from __future__ import annotations

import pytest

from retry_scheduler.core.jobs import Status
from retry_scheduler.db.selection import Selection
from retry_scheduler.ops.dlq import DlqError, Operation


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
