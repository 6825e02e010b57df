"""The approval gate of ``dlq_replay`` under the dev stack's real scheduler and api-server (issue 33).

With ``RETRY_REPLAY_APPROVAL_ABOVE=3``, a replay of more dead jobs than that waits in its
``approve`` task (Airflow 3.3's ``awaiting_input``, no triggerer) for a second person, answered
through the REST API as the UI's *Required actions* page answers it. Approved by another user: the
jobs are replayed, both names audited. Rejected: nothing is sent, the rejection and its author
audited. Approved by the requester: refused (audited so), nothing sent, and asked again for someone else.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from retry_scheduler.dev.airflow_api import api_call, api_token, dag_url, trigger_dag, wait_for_dag_run
from retry_scheduler.dev.stack import DevStack
from tests.conftest import empty_service_tables
from tests.e2e.stacks import new_dev_stack
from tests.e2e.test_backfill import fresh_dag
from tests.integration.test_dlq import dead_job, insert

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

GATE = 3


@pytest.fixture(scope="module")
def module_stack(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    home: Path = tmp_path_factory.mktemp("approval")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RETRY_REPLAY_APPROVAL_ABOVE", str(GATE))
        with new_dev_stack(module_database_url, home, "retry_airflow_approval_", triggerer=False) as stack:
            yield stack


@pytest.fixture
def stack(module_stack: DevStack) -> DevStack:
    empty_service_tables(module_stack.settings.database_url)
    return module_stack


def run_url(stack: DevStack, run_id: str) -> str:
    return f"{dag_url(stack.base_url, 'dlq_replay')}/dagRuns/{urllib.parse.quote(run_id, safe='')}"


def wait_for_approval(stack: DevStack, token: str, run_id: str, timeout: float = 180.0) -> dict[str, Any]:
    """The ``approve`` task's request, once the scheduler has seen the request's workload end.

    Airflow 3.3.2 with the LocalExecutor: the task parks itself ``awaiting_input`` and its workload
    ends a moment later (5 s on a loaded machine); an answer that resumes the task before the
    scheduler has processed that end makes it take the task's state for changed outside it, fail the
    try and retry it, which asks again. A person answers later than that; the test waits for the
    scheduler's "TaskInstance Finished" line of the try, as its log says it.
    """
    url = f"{run_url(stack, run_id)}/taskInstances/approve"
    deadline = time.monotonic() + timeout
    while (ti := api_call("GET", url, token)).get("state") not in ("awaiting_input", "deferred"):
        assert ti.get("state") not in ("failed", "upstream_failed", "skipped", "success"), ti.get("state")
        assert time.monotonic() < deadline, f"the approve task is still {ti.get('state')}"
        time.sleep(1)
    seen = f"TaskInstance Finished: dag_id=dlq_replay, task_id=approve, run_id={run_id},"
    tried = f", try_number={ti['try_number']},"
    log = stack.log_dir / "scheduler.log"
    while not any(seen in line and tried in line for line in log.read_text(errors="replace").splitlines()):
        assert time.monotonic() < deadline, "the scheduler never saw the approval request's workload end"
        time.sleep(0.5)
    assert api_call("GET", url, token).get("state") in ("awaiting_input", "deferred")
    return dict(api_call("GET", f"{url}/-1/hitlDetails", token))


def answer(stack: DevStack, token: str, run_id: str, option: str) -> None:
    url = f"{run_url(stack, run_id)}/taskInstances/approve/-1/hitlDetails"
    api_call("PATCH", url, token, {"chosen_options": [option], "params_input": {}})


def task_states(stack: DevStack, token: str, run_id: str) -> dict[str, str]:
    listed = api_call("GET", f"{run_url(stack, run_id)}/taskInstances", token)["task_instances"]
    return {ti["task_id"]: ti["state"] for ti in listed}


def audit_rows(database_url: str, run_id: str) -> list[dict[str, Any]]:
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT dry_run, actor, affected, matched, approval, approved_by FROM retry_dlq_audit "
            "WHERE run_id = %s ORDER BY id",
            (run_id,),
        ).fetchall()


def statuses(database_url: str) -> dict[str, int]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT status::text, count(*) FROM retry_jobs_all GROUP BY 1").fetchall()
    return {status: int(n) for status, n in rows}


def test_a_large_replay_waits_for_a_second_person_approved_rejected_or_refused(stack: DevStack) -> None:
    database_url = stack.settings.database_url
    admin = fresh_dag(stack, "dlq_replay", paused=False)
    approver = api_token(stack.base_url, "approver", "approver")
    insert(database_url, [dead_job(i) for i in range(1, 6)])  # 5 of orders: more than the gate's 3

    # Approved by someone else: replayed, at most what the approver was shown, both names audited.
    run = trigger_dag(stack.base_url, admin, "dlq_replay", {"destination": "orders", "dry_run": False})
    asked = wait_for_approval(stack, admin, run["dag_run_id"])
    assert asked["subject"] == "Replay 5 dead letters? (asked by admin)"
    assert (
        "| `orders` | 5 |" in asked["body"] and "**admin** asks to replay **5** dead letters" in asked["body"]
    )
    assert statuses(database_url) == {"dead": 5}  # nothing sent while it waits
    insert(database_url, [dead_job(i) for i in range(6, 8)])  # two more die meanwhile: not approved
    answer(stack, approver, run["dag_run_id"], "Approve")
    done = wait_for_dag_run(stack.base_url, admin, "dlq_replay", run["dag_run_id"])
    assert done["state"] == "success", task_states(stack, admin, run["dag_run_id"])
    assert statuses(database_url) == {"pending": 5, "dead": 2}
    with psycopg.connect(database_url) as conn:
        still_dead = [
            r[0] for r in conn.execute("SELECT source_offset FROM retry_jobs WHERE status = 'dead'")
        ]
    assert sorted(still_dead) == [6, 7]  # the newer ones, dead after the approval was asked
    plan, replay = audit_rows(database_url, run["dag_run_id"])
    assert (plan["dry_run"], plan["actor"], plan["approval"], plan["approved_by"]) == (
        True,
        "admin",
        "approved",
        "approver",
    )
    assert (replay["dry_run"], replay["actor"], replay["affected"], replay["approved_by"]) == (
        False, "admin", 5, "approver"
    )  # fmt: skip

    # Rejected: nothing is sent; the dry run's row says who rejected it.
    empty_service_tables(database_url)
    insert(database_url, [dead_job(i, destination="payments") for i in range(1, 5)])
    run = trigger_dag(stack.base_url, admin, "dlq_replay", {"destination": "payments", "dry_run": False})
    wait_for_approval(stack, admin, run["dag_run_id"])
    answer(stack, approver, run["dag_run_id"], "Reject")
    done = wait_for_dag_run(stack.base_url, admin, "dlq_replay", run["dag_run_id"])
    states = task_states(stack, admin, run["dag_run_id"])
    assert (done["state"], states["operate"], states["approve"]) == ("success", "skipped", "success"), states
    assert statuses(database_url) == {"dead": 4}
    [plan] = audit_rows(database_url, run["dag_run_id"])
    assert (plan["dry_run"], plan["approval"], plan["approved_by"], plan["affected"]) == (
        True,
        "rejected",
        "approver",
        0,
    )

    # Approved by the requester: refused, nothing sent, the audit says who tried, and the request is
    # asked again (the approve task's retry) for someone else, who rejects it.
    run = trigger_dag(stack.base_url, admin, "dlq_replay", {"destination": "payments", "dry_run": False})
    wait_for_approval(stack, admin, run["dag_run_id"])
    answer(stack, admin, run["dag_run_id"], "Approve")
    url = f"{run_url(stack, run['dag_run_id'])}/taskInstances/approve"
    deadline = time.monotonic() + 120
    while api_call("GET", url, admin).get("try_number") != 2:
        assert time.monotonic() < deadline, "the approval was not asked again"
        time.sleep(1)
    [plan] = audit_rows(database_url, run["dag_run_id"])
    assert (plan["dry_run"], plan["actor"], plan["approval"], plan["approved_by"]) == (
        True, "admin", "refused", "admin"
    )  # fmt: skip
    assert statuses(database_url) == {"dead": 4}
    wait_for_approval(stack, admin, run["dag_run_id"])
    answer(stack, approver, run["dag_run_id"], "Reject")
    done = wait_for_dag_run(stack.base_url, admin, "dlq_replay", run["dag_run_id"])
    assert (done["state"], task_states(stack, admin, run["dag_run_id"])["operate"]) == ("success", "skipped")
    assert statuses(database_url) == {"dead": 4}
    [plan] = audit_rows(database_url, run["dag_run_id"])  # no replay row
    assert (plan["approval"], plan["approved_by"]) == ("rejected", "approver")


def test_a_replay_within_the_gate_or_a_dry_run_asks_nobody(stack: DevStack) -> None:
    database_url = stack.settings.database_url
    admin = fresh_dag(stack, "dlq_replay", paused=False)
    insert(database_url, [dead_job(i) for i in range(1, 4)])  # 3: not more than the gate
    dry = trigger_dag(stack.base_url, admin, "dlq_replay", {"destination": "orders"})
    assert wait_for_dag_run(stack.base_url, admin, "dlq_replay", dry["dag_run_id"])["state"] == "success"
    assert task_states(stack, admin, dry["dag_run_id"])["approve"] == "skipped"
    run = trigger_dag(stack.base_url, admin, "dlq_replay", {"destination": "orders", "dry_run": False})
    done = wait_for_dag_run(stack.base_url, admin, "dlq_replay", run["dag_run_id"])
    states = task_states(stack, admin, run["dag_run_id"])
    assert (done["state"], states["approve"], states["operate"]) == ("success", "skipped", "success"), states
    assert statuses(database_url) == {"pending": 3}
