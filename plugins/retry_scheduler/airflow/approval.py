"""The approval gate of the ``dlq_replay`` DAG: a replay above ``RETRY_REPLAY_APPROVAL_ABOVE`` dead
jobs waits for a second person.

The run's ``plan`` task makes the dry run of what it was asked (audited as a dry run) and, when the
replay is larger than the gate, hands its figures to Airflow's ``ApprovalOperator`` (the standard
provider's human-in-the-loop operator, Airflow 3.1+): the approver sees how many letters of each
destination would go, at what pace, and who asked. *Approve* lets the ``operate`` task replay, at
most the oldest jobs the approver was shown (letters dead since are newer, and left alone), with the
approver audited beside the requester. An approver who is the requester is refused, nothing sent: the
audit reads ``approval=refused`` with their name, and the ``approve`` task's try fails, so that its
retry asks again, for someone else (a later answer then replaces the refusal on the audit row; the
try's log keeps it). With no retry left, the run fails and nothing is sent.
*Reject* skips the replay: nothing is sent. Either way the dry run's audit row keeps the decision
and who made it (:class:`ReplayApprovalOperator`). A request unanswered for :data:`RESPONSE_TIMEOUT`
fails its try; the task's retry asks once more, and the run's own timeout (6 h) ends it: nothing sent.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.hitl import ApprovalOperator

from retry_scheduler.airflow.hook import RetrySchedulerHook, settings_from_connections
from retry_scheduler.core.config import Settings
from retry_scheduler.core.deployment import Deployment

if TYPE_CHECKING:
    from airflow.sdk import Context

    from retry_scheduler.ops.dlq import Approval

log = logging.getLogger(__name__)

#: How long a replay waits for its approval before the run fails (nothing sent).
RESPONSE_TIMEOUT = timedelta(hours=4)
#: The destinations listed in the approver's table (the rest summed up in one line).
SHOWN_DESTINATIONS = 50


def approval_request(
    params: dict[str, Any], actor: str | None, run_id: str | None, settings: Settings | None = None
) -> dict[str, Any] | None:
    """The ``plan`` task: None when the run needs no approval (a dry run, a purge, a re-evaluation,
    the gate off, or a replay within it); otherwise what the approver is shown (``subject``,
    ``body`` in Markdown) and what the replay is bounded to (``audit_id`` of the dry run, ``matched``)."""
    from retry_scheduler.airflow.tasks import dlq_operation
    from retry_scheduler.ops.dlq import run_action

    settings = settings or settings_from_connections()
    above = settings.replay_approval_above
    if not above or params.get("action", "replay") != "replay" or params.get("dry_run", True):
        return None
    operation = dlq_operation({**params, "dry_run": True}, actor, run_id, settings)
    deployment = Deployment.load(settings)
    plan = run_action(settings.database_url, operation, deployment=deployment)
    log.info("the approval gate's dry run: %s", plan.summary())
    if plan.would_affect <= above:
        log.info(
            "%s jobs to replay, within RETRY_REPLAY_APPROVAL_ABOVE=%s: no approval needed",
            plan.would_affect,
            above,
        )
        return None
    rows = sorted(plan.per_destination.items(), key=lambda item: (-item[1], item[0]))
    table = "\n".join(f"| `{d}` | {n:,} |" for d, n in rows[:SHOWN_DESTINATIONS])
    more = (
        f"\n| {len(rows) - SHOWN_DESTINATIONS:,} more destinations | "
        f"{sum(n for _, n in rows[SHOWN_DESTINATIONS:]):,} |"
        if len(rows) > SHOWN_DESTINATIONS
        else ""
    )
    requester = operation.actor
    body = (
        f"**{requester}** asks to replay **{plan.would_affect:,}** dead letters (more than the "
        f"{above:,} that need no approval).\n\n| destination | letters |\n|---|---|\n{table}{more}\n\n"
        f"Dry run (audit {plan.audit_id}): {plan.summary()}\n\n"
        "*Approve* replays at most these letters (the oldest of the filter); *Reject* sends nothing. "
        "The approver must be someone other than the requester."
    )
    log.info("waiting for a second person's approval of %s jobs", plan.would_affect)
    return {
        "subject": f"Replay {plan.would_affect:,} dead letters? (asked by {requester})",
        "body": body,
        "audit_id": plan.audit_id,
        "matched": plan.matched,
        "requester": requester,
    }


def decision(response: Any) -> tuple[str, str] | None:
    """``("approved" | "rejected", who)`` from the approval task's result (its XCom), or None when
    it did not run (no approval was needed)."""
    if not isinstance(response, dict) or not response.get("chosen_options"):
        return None
    user = response.get("responded_by_user") or {}
    who = str(user.get("name") or user.get("id") or "?") if isinstance(user, dict) else str(user)
    return ("approved" if response["chosen_options"][0] == "Approve" else "rejected"), who


def approval_of(request: dict[str, Any] | None, response: Any) -> Approval | None:
    """The approval the ``operate`` task replays under (None: none was needed). A run whose request
    has no approving answer does not get here: the gate skipped its replay."""
    from retry_scheduler.ops.dlq import Approval

    if request is None:
        return None
    decided = decision(response)
    if decided is None or decided[0] != "approved":
        raise RuntimeError("this replay needed an approval and has none: nothing was sent")
    return Approval(by=decided[1], matched=int(request["matched"]))


class ReplayApprovalOperator(ApprovalOperator):
    """The standard provider's ``ApprovalOperator``, which also records the decision and who took it
    on the audit row of the dry run the approver was shown (``plan``'s request), as it arrives."""

    def __init__(self, *, hook: RetrySchedulerHook, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hook = hook

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        from retry_scheduler.ops.dlq import record_approval

        # Recorded first: on Reject, the operator skips the replay by raising (the Task SDK's
        # DownstreamTasksSkipped), so nothing after it would run.
        decided = None if "error" in event else decision(event)
        request = context["ti"].xcom_pull(task_ids="plan", key="approval_request")
        if decided is not None and request is not None and set(event["chosen_options"]) <= set(self.options):
            if decided == ("approved", request.get("requester")):
                # The requester approving their own replay is no approval: the audit says so, naming
                # who tried, and this try fails, so that the task's retry asks again, for someone else.
                record_approval(
                    self.hook.settings().database_url, int(request["audit_id"]), "refused", decided[1]
                )
                raise SelfApprovalError(
                    f"{decided[1]} approved their own replay: refused, nothing sent (audit {request['audit_id']}). "
                    "The approval is asked again on this task's retry: someone else must answer"
                )
            record_approval(self.hook.settings().database_url, int(request["audit_id"]), *decided)
            log.info("replay %s by %s (audit %s)", decided[0], decided[1], request["audit_id"])
        return super().execute_complete(context, event)


class SelfApprovalError(RuntimeError):
    """The requester answered their own replay's approval: refused (nothing sent)."""
