"""The ``dlq_replay`` DAG through Airflow's real ``dag.test()``: its form, the dry run, replay, purge, audit."""

from __future__ import annotations

import psycopg
import pytest

from bench.jobs import insert_jobs
from retry_scheduler.db.store import Store
from tests.conftest import ROOT
from tests.integration.test_dlq import dead_job

pytestmark = [pytest.mark.airflow, pytest.mark.integration]


@pytest.fixture
def trigger(airflow_db, database_url: str, monkeypatch: pytest.MonkeyPatch):
    """``trigger(conf)`` runs the DAG as a user's trigger would: a fresh parse, the form's values."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW_CONN_RETRY_POSTGRES", database_url)

    def run(conf: dict):
        # dag.test() writes run_conf into the DAG object's params: parse again for every run.
        dag = DagBag(dag_folder=str(ROOT / "dags")).get_dag("dlq_replay")
        return dag.test(run_conf=conf)

    return run


def rows(database_url: str, query: str) -> list[tuple]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(query).fetchall()  # type: ignore[arg-type]


def outcome(run) -> dict:
    [ti] = [ti for ti in run.get_task_instances() if ti.task_id == "operate"]
    return ti.xcom_pull(task_ids="operate")


def test_dry_run_then_replay_then_purge_each_audited(trigger, database_url: str) -> None:
    from airflow.utils.state import DagRunState

    with Store(database_url) as store:
        insert_jobs(
            store, [dead_job(1, destination="payments"), dead_job(2, destination="payments"), dead_job(3)]
        )
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE retry_jobs SET dlq_published_at = now() WHERE id = 3")

    dry = trigger({"destination": "payments"})  # the form's defaults: replay, dry run
    assert dry.state == DagRunState.SUCCESS
    assert (outcome(dry)["matched"], outcome(dry)["would_affect"], outcome(dry)["affected"]) == (2, 2, 0)
    assert rows(database_url, "SELECT count(*) FROM retry_jobs_all WHERE status = 'dead'") == [(3,)]

    replay = trigger({"destination": "payments", "dry_run": False, "reset_attempts": True})
    assert replay.state == DagRunState.SUCCESS
    assert outcome(replay)["affected"] == 2
    assert rows(database_url, "SELECT id, status::text, attempt FROM retry_jobs_all ORDER BY id") == [
        (1, "pending", 0),
        (2, "pending", 0),
        (3, "dead", 3),
    ]

    purge = trigger({"action": "purge", "ids": "3", "dry_run": False})
    assert purge.state == DagRunState.SUCCESS
    assert outcome(purge)["affected"] == 1
    assert rows(database_url, "SELECT id FROM retry_jobs_all ORDER BY id") == [(1,), (2,)]

    audit = rows(
        database_url,
        "SELECT action, dry_run, actor, source, run_id, filter, reset_attempts, matched, affected"
        " FROM retry_dlq_audit ORDER BY id",
    )
    assert audit == [
        ("replay", True, "dag_test", "dag", dry.run_id, {"destination": "payments"}, False, 2, 0),
        ("replay", False, "dag_test", "dag", replay.run_id, {"destination": "payments"}, True, 2, 2),
        ("purge", False, "dag_test", "dag", purge.run_id, {"ids": [3]}, False, 1, 1),
    ]


def test_reevaluate_makes_pending_the_invalid_jobs_the_current_policies_allow(
    trigger, database_url: str
) -> None:
    """Dead invalid when ``orders`` was not allowed; the DAGs folder's policies allow it now."""
    from airflow.utils.state import DagRunState

    from tests.airflow.test_dead_letters_api import insert_dead

    record = {"destination": None, "dead_reason": "invalid", "reason": "destination 'orders' is not allowed"}
    passes = insert_dead(database_url, **record, headers=[("retry.destination", b"orders")])
    fails = insert_dead(database_url, **record, headers=[("retry.destination", b"elsewhere")])

    dry = trigger({"action": "reevaluate"})
    assert dry.state == DagRunState.SUCCESS
    assert (outcome(dry)["matched"], outcome(dry)["would_affect"], outcome(dry)["affected"]) == (2, 1, 0)
    done = trigger({"action": "reevaluate", "dry_run": False})
    assert done.state == DagRunState.SUCCESS
    assert (outcome(done)["affected"], outcome(done)["skipped"]) == (1, {"still invalid": 1})
    assert rows(database_url, "SELECT id, status::text, destination FROM retry_jobs_all ORDER BY id") == [
        (passes, "pending", "orders"),
        (fails, "dead", None),
    ]
    assert rows(
        database_url, "SELECT action, dry_run, run_id, affected FROM retry_dlq_audit ORDER BY id"
    ) == [
        ("reevaluate", True, dry.run_id, 0),
        ("reevaluate", False, done.run_id, 1),
    ]
    refused = trigger({"action": "reevaluate", "reset_attempts": True, "dry_run": False})
    assert refused.state == DagRunState.FAILED


def test_the_forms_rate_paces_the_replay_and_is_audited(trigger, database_url: str) -> None:
    """The form's rate: 4 jobs of one destination at 2/s fall due 0.5 s apart; the task's outcome
    and the audit keep the rate; a purge with a rate fails, and nothing is purged."""
    from airflow.utils.state import DagRunState

    with Store(database_url) as store:
        insert_jobs(store, [dead_job(n) for n in range(1, 5)])
    paced = trigger({"destination": "orders", "dry_run": False, "rate": 2})
    assert paced.state == DagRunState.SUCCESS
    assert (outcome(paced)["affected"], outcome(paced)["rate_per_s"], outcome(paced)["paced_s"]) == (
        4,
        2.0,
        1.5,
    )
    [(gaps,)] = rows(
        database_url,
        "SELECT array_agg(round(extract(epoch FROM due_at - lag)::numeric, 3) ORDER BY id) FROM "
        "(SELECT id, due_at, lag(due_at) OVER (ORDER BY id) FROM retry_jobs) AS d WHERE lag IS NOT NULL",
    )
    assert [float(g) for g in gaps] == [0.5, 0.5, 0.5]
    assert rows(database_url, "SELECT rate_per_s FROM retry_dlq_audit ORDER BY id DESC LIMIT 1") == [(2.0,)]
    refused = trigger({"action": "purge", "ids": "1", "rate": 2, "dry_run": False})
    assert refused.state == DagRunState.FAILED
    assert rows(database_url, "SELECT count(*) FROM retry_jobs_all") == [(4,)]


def test_the_forms_canary_and_stop_share_watch_the_replay(trigger, database_url: str) -> None:
    """The form's watch: a dry run says its waves (a canary of 2, then the rest) and audits how it is
    watched; a canary of 0 % fails the run, and nothing is replayed (one that is not a number or a
    share, the form refuses: below)."""
    from airflow.utils.state import DagRunState

    with Store(database_url) as store:
        insert_jobs(store, [dead_job(n) for n in range(1, 6)])
    dry = trigger({"destination": "orders", "canary": "2", "stop_above": "20%", "verdict_window": "10s"})
    assert dry.state == DagRunState.SUCCESS
    assert (outcome(dry)["waves"], outcome(dry)["would_affect"]) == (2, 5)
    assert outcome(dry)["watch"] == {
        "canary": 2,
        "canary_share": 0.0,
        "verdict_s": 10.0,
        "stop_share": 0.2,
        "wave": 10_000,
    }
    assert rows(
        database_url,
        "SELECT watch->>'canary', watch->>'stop_share' FROM retry_dlq_audit ORDER BY id DESC LIMIT 1",
    ) == [("2", "0.2")]
    refused = trigger(
        {"destination": "orders", "canary": "0%", "dry_run": False}
    )  # the form's pattern admits it
    assert refused.state == DagRunState.FAILED
    assert rows(database_url, "SELECT count(*) FROM retry_jobs WHERE status = 'dead'") == [(5,)]


def test_the_form_refuses_what_it_cannot_do(trigger) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    for conf in (
        {"action": "explode"}, {"dead_reason": "tired"}, {"ids": "1; DROP TABLE"}, {"limit": -1}, {"rate": -1},
        {"rate": "fast"}, {"canary": "every"}, {"stop_above": "most"}, {"verdict_window": "soon"},
    ):  # fmt: skip
        with pytest.raises(ParamValidationError):
            trigger(conf)


def test_the_form_narrows_to_the_letters_one_tool_wrote(
    trigger, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``written_by`` picks the letters read from that tool's adopted topics (RETRY_ADOPT_TOPICS), as
    the page's hand-over passes it; a run's own list of topics is never taken."""
    from dataclasses import replace

    from airflow.sdk.definitions.param import ParamValidationError

    monkeypatch.setenv("RETRY_ADOPT_TOPICS", "orders.DLT=spring")
    with Store(database_url) as store:
        insert_jobs(store, [dead_job(1), replace(dead_job(2), source_topic="orders.DLT")])

    spring = trigger({"written_by": "spring"})
    ours = trigger({"written_by": "retry-scheduler"})
    sneaked = trigger({"source_topics": ["orders.DLT"]})  # not a field of the form: no filter

    assert (outcome(spring)["matched"], outcome(ours)["matched"], outcome(sneaked)["matched"]) == (1, 1, 2)
    audit = rows(database_url, "SELECT filter FROM retry_dlq_audit ORDER BY id")
    assert audit[0] == ({"source_topics": ["orders.DLT"]},)
    with pytest.raises(ParamValidationError):
        trigger({"written_by": "camel"})
