"""The ``dlq_window_replay`` DAG through Airflow's real ``dag.test()``: each run replays exactly the dead
jobs of its data interval (one UTC hour, start included, end excluded), once, audited.

The DAG makes backfill runs only (its end date is its start date, manual runs are not allowed), and
``dag.test()`` makes a manual run, whose tasks the end date would leave out: these tests run the DAG
with its dates lifted. The DAG as it is, under the real scheduler with ``airflow backfill create``:
``tests/e2e/test_backfill.py``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from tests.conftest import ROOT
from tests.integration.test_dlq import dead_job, insert, sql

pytestmark = [pytest.mark.airflow, pytest.mark.integration]

HOUR = datetime(2026, 11, 20, 9, tzinfo=UTC)


@pytest.fixture
def trigger(airflow_db, database_url: str, monkeypatch: pytest.MonkeyPatch):
    """``trigger(logical_date, conf)``: a fresh parse of the DAGs folder, then ``dag.test()``."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW_CONN_RETRY_POSTGRES", database_url)

    def run(logical_date: datetime, conf: dict):
        dag = DagBag(dag_folder=str(ROOT / "dags")).get_dag("dlq_window_replay")
        dag.end_date = None  # what a backfill's run ignores
        for task in dag.tasks:
            task.end_date = None
        return dag.test(logical_date=logical_date, run_conf=conf)

    return run


def test_the_dag_makes_no_runs_of_its_own_and_waits_unpaused_for_backfills() -> None:
    """What makes the documented backfill replay an hour that has just ended: no scheduled run can
    take it first (nothing is scheduled after the end date), and nothing waits for an unpause."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    dag = DagBag(dag_folder=str(ROOT / "dags")).get_dag("dlq_window_replay")
    assert dag.end_date == dag.start_date and dag.is_paused_upon_creation is False
    assert {t.end_date for t in dag.tasks} == {dag.end_date}
    assert sorted(getattr(t, "value", t) for t in dag.allowed_run_types) == ["backfill", "scheduled"]
    scheduled = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    assert scheduled.next_dagrun_info(last_automated_run_info=None) is None
    # while a backfill's range is every hour asked for, before or after the DAG's dates
    hours = scheduled.iter_dagrun_infos_between(HOUR, HOUR + timedelta(hours=2))
    assert [info.data_interval.start for info in hours] == [HOUR + timedelta(hours=h) for h in range(3)]


def outcome(run) -> dict:
    [ti] = [ti for ti in run.get_task_instances() if ti.task_id == "replay_window"]
    return ti.xcom_pull(task_ids="replay_window")


def replay_events(dag_id: str, run_id: str) -> list[dict]:
    """The ``retry_scheduler_replays`` asset events a run recorded (their extra)."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from retry_scheduler.airflow.assets import REPLAYS_ASSET

    with create_session() as session:
        return list(
            session.scalars(
                select(AssetEvent.extra)
                .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                .where(AssetModel.name == REPLAYS_ASSET)
                .where(AssetEvent.source_dag_id == dag_id, AssetEvent.source_run_id == run_id)
            )
        )


def dead_at(database_url: str, when: dict[int, datetime]) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for offset, at in when.items():
            conn.execute("UPDATE retry_jobs SET dead_at = %s WHERE source_offset = %s", (at, offset))


def test_each_run_replays_the_dead_jobs_of_its_hour_once(trigger, database_url: str) -> None:
    from airflow.utils.state import DagRunState

    insert(
        database_url,
        [
            dead_job(1, destination="payments"),  # at the hour's start: in
            dead_job(2, destination="payments"),  # a microsecond before its end: in
            dead_job(3, destination="payments"),  # at its end: the next hour's
            dead_job(4, destination="payments"),  # a microsecond before its start: the last hour's
            dead_job(5, destination="orders"),  # in the hour, another destination
            dead_job(6, destination="payments", reason="invalid"),  # in the hour, never replayed
        ],
    )
    start, end = HOUR, HOUR + timedelta(hours=1)
    dead_at(
        database_url,
        {
            1: start,
            2: end - timedelta(microseconds=1),
            3: end,
            4: start - timedelta(microseconds=1),
            5: start + timedelta(minutes=30),
            6: start + timedelta(minutes=1),
        },
    )

    # The run for the hour starting at HOUR (a manual run's interval is the last complete hour
    # before its logical date). The conf cannot widen the window: since, until and ids are ignored.
    # The form's canary is taken (a watched replay of the window: the canary, then the rest).
    dry = trigger(
        end, {"destination": "payments", "since": "2020-01-01T00:00:00Z", "ids": "3,4", "canary": "1"}
    )
    assert dry.state == DagRunState.SUCCESS
    assert (dry.data_interval_start, dry.data_interval_end) == (start, end)
    assert (outcome(dry)["matched"], outcome(dry)["would_affect"], outcome(dry)["affected"]) == (3, 2, 0)
    assert (outcome(dry)["waves"], outcome(dry)["watch"]["canary"]) == (2, 1)
    assert sql(database_url, "SELECT count(*) FROM retry_jobs_all WHERE status = 'dead'") == [(6,)]

    replay = trigger(end, {"destination": "payments", "dry_run": False})
    assert replay.state == DagRunState.SUCCESS
    assert outcome(replay)["affected"] == 2
    assert sql(
        database_url, "SELECT source_offset, status::text FROM retry_jobs_all ORDER BY source_offset"
    ) == [
        (1, "pending"),
        (2, "pending"),
        (3, "dead"),
        (4, "dead"),
        (5, "dead"),
        (6, "dead"),
    ]

    again = trigger(end, {"destination": "payments", "dry_run": False})
    assert again.state == DagRunState.SUCCESS
    assert outcome(again)["affected"] == 0

    window = {"since": start.isoformat(), "until": end.isoformat(), "destination": "payments"}
    # Only the run that replayed something updated the replays asset, with its audit record.
    assert replay_events("dlq_window_replay", dry.run_id) == []  # a dry run: record skipped
    assert replay_events("dlq_window_replay", again.run_id) == []  # nothing replayed
    [event] = replay_events("dlq_window_replay", replay.run_id)
    assert {k: event[k] for k in ("dag_id", "run_id", "action", "matched", "replayed", "filter")} == {
        "dag_id": "dlq_window_replay",
        "run_id": replay.run_id,
        "action": "replay",
        "matched": 3,
        "replayed": 2,
        "filter": window,
    }
    audit = sql(
        database_url,
        "SELECT action, dry_run, source, run_id, filter, affected FROM retry_dlq_audit ORDER BY id",
    )
    assert audit == [
        ("replay", True, "dag", dry.run_id, window, 0),
        ("replay", False, "dag", replay.run_id, window, 2),
        ("replay", False, "dag", again.run_id, window, 0),
    ]


def test_without_a_destination_every_destination_of_the_hour_is_replayed(trigger, database_url: str) -> None:
    insert(
        database_url, [dead_job(1, destination="payments"), dead_job(2, destination="orders"), dead_job(3)]
    )
    dead_at(database_url, {1: HOUR, 2: HOUR + timedelta(minutes=59), 3: HOUR + timedelta(hours=2)})

    run = trigger(HOUR + timedelta(hours=1), {"dry_run": False})
    assert outcome(run)["affected"] == 2
    assert sql(database_url, "SELECT source_offset FROM retry_jobs_all WHERE status = 'dead'") == [(3,)]
