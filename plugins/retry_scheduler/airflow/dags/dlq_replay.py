"""
### dlq_replay

Replays or purges **dead** jobs (kept in PostgreSQL, published to the DLQ topic) selected by
the form's filter. **Run it as a dry run first** (the default): the task log then says how
many jobs match and which would be left alone, and nothing changes.

* **replay** makes the jobs due now; the `retry_scheduler` DAG's publish loop sends them to
  their destination with `retry.attempt` raised (set *reset attempts* to start the policy's
  schedule again). Jobs that went dead as `invalid` are left alone: their headers named no
  usable destination.
* **reevaluate** reads dead `invalid` jobs again against the current policies, after fixing
  what made them invalid (a destination not yet allowed, a policy not yet deployed): those that
  pass now become pending with their original bytes, the rest stay dead with what the current
  policies say of them.
* **purge** deletes the jobs whose record is already on the DLQ topic; a dead job not yet
  published there is kept, since it exists nowhere else.

Every run, dry or not, writes an audit row (`retry_dlq_audit`: action, filter, counts, the
Airflow user who triggered it and the run id).

**Approval.** With `RETRY_REPLAY_APPROVAL_ABOVE` set, a replay (not a dry run) of more dead jobs
than that waits in its `approve` task for a second person (Airflow's *Required actions*): they see
the dry run's counts per destination and who asked. *Approve* replays at most those letters, the
approver audited beside the requester (who may not approve their own replay); *Reject* sends
nothing, and the dry run's audit row keeps who rejected it. The same operations: the *Dead letters* page
(`/retry-scheduler/`) and `retry-scheduler dlq list|show|replay [--reevaluate]|purge`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import DAG, Param, get_current_context, task

from retry_scheduler.airflow.dags import build_dag, default_args, in_dag_file, run_failure_callbacks
from retry_scheduler.airflow.dags.forms import replay_option_params, selection_params
from retry_scheduler.airflow.hook import RetrySchedulerHook


def arguments() -> dict:
    """The DAG's own arguments, before a factory's options."""
    return dict(
        dag_id="dlq_replay",
        schedule=None,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        dagrun_timeout=timedelta(hours=6),
        # a retry continues where a failed run stopped: replayed or purged jobs are no longer dead
        default_args=default_args(retries=1, retry_delay=timedelta(seconds=30)),
        # a run that fails (or outlives its dagrun_timeout) alerts too, once, through the same channels
        on_failure_callback=run_failure_callbacks(),
        params={
            "action": Param(
                "replay",
                enum=["replay", "purge", "reevaluate"],
                title="Action",
                description="reevaluate: read dead invalid jobs again against the current policies (after "
                "fixing them); those that pass become pending with their original bytes.",
            ),
            **selection_params(),
            **replay_option_params(),
        },
        tags=["retry-scheduler", "operations"],
        doc_md=__doc__,
    )


def dlq_replay_tasks(hook: RetrySchedulerHook) -> None:
    """The DAG's tasks, reading their settings through ``hook`` when they run: ``plan`` (the approval
    gate's dry run, :mod:`retry_scheduler.airflow.approval`), ``approve`` when the replay is larger
    than ``RETRY_REPLAY_APPROVAL_ABOVE`` (its decision audited), then ``operate``."""
    from airflow.providers.standard.operators.empty import EmptyOperator

    from retry_scheduler.airflow.approval import RESPONSE_TIMEOUT, ReplayApprovalOperator

    @task.branch
    def plan() -> str:
        """Whether the replay waits for a second person's approval (a dry run of it when it may)."""
        from retry_scheduler.airflow.approval import approval_request

        context = get_current_context()
        dag_run = context["dag_run"]
        request = approval_request(
            dict(context["params"]),
            getattr(dag_run, "triggering_user_name", None),
            dag_run.run_id,
            hook.settings(),
        )
        context["ti"].xcom_push(key="approval_request", value=request)
        return "approve" if request else "no_approval_needed"

    asked = "(ti.xcom_pull(task_ids='plan', key='approval_request') or {})"
    approve = ReplayApprovalOperator(
        task_id="approve",
        hook=hook,
        subject="{{ " + asked + ".get('subject', 'Replay dead letters?') }}",
        body="{{ " + asked + ".get('body', '') }}",
        response_timeout=RESPONSE_TIMEOUT,
    )
    no_approval = EmptyOperator(task_id="no_approval_needed")

    @task(trigger_rule="none_failed_min_one_success")
    def operate() -> dict:
        """Replay or purge the selected dead jobs (or only count them on a dry run)."""
        from retry_scheduler.airflow.approval import approval_of
        from retry_scheduler.airflow.tasks import run_dlq_operation

        context = get_current_context()
        dag_run, ti = context["dag_run"], context["ti"]
        request = ti.xcom_pull(task_ids="plan", key="approval_request")
        return run_dlq_operation(
            dict(context["params"]),
            getattr(dag_run, "triggering_user_name", None),
            dag_run.run_id,
            hook.settings(),
            approval=approval_of(request, ti.xcom_pull(task_ids="approve")),
        )

    gate = plan()
    done = operate()
    gate >> [approve, no_approval]
    [approve, no_approval] >> done


def dlq_replay_dag(**options: Any) -> DAG:
    """Build the ``dlq_replay`` DAG; call it from a file in the DAGs folder.

    ``options``: :class:`~retry_scheduler.airflow.dags.DagOptions` (``dag_id``, ``pool``, ``queue``...).
    """
    built = build_dag("dlq_replay_dag", options, arguments(), dlq_replay_tasks)
    return in_dag_file(built)
