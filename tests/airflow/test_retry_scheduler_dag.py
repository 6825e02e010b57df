"""End to end through Airflow's real ``dag.test()``: records move from the retry topic to their
destination and to the DLQ, with counts in XCom."""

from __future__ import annotations

import json
import time

import psycopg
import pytest

from retry_scheduler.core import protocol as p
from tests.conftest import ROOT
from tests.kafkautil import consume, create_topics, produce

pytestmark = [pytest.mark.airflow, pytest.mark.integration]


def test_dag_moves_records_to_destination_and_dlq(
    airflow_db, database_url: str, bootstrap_servers: str, topic_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    retry_topic, dest = f"{topic_prefix}-retry", f"{topic_prefix}-orders"
    for key, value in {
        "AIRFLOW_CONN_RETRY_POSTGRES": database_url,
        "AIRFLOW_CONN_RETRY_KAFKA": json.dumps(
            {"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap_servers}}
        ),
        "RETRY_TOPIC": retry_topic,
        "RETRY_CONSUMER_GROUP": f"{topic_prefix}-scheduler",
        "RETRY_CREATE_TOPICS": "true",
        "RETRY_LOOP_GRACE_MS": "0",  # dag.test() runs one task at a time: no loop ever relieves another
    }.items():
        monkeypatch.setenv(key, value)
    create_topics(bootstrap_servers, [dest])
    now = int(time.time() * 1000)
    produce(
        bootstrap_servers,
        retry_topic,
        [
            {
                "key": b"due",
                "value": b"1",
                "headers": [("retry.destination", dest.encode()), ("retry.at", str(now).encode())],
            },
            {
                "key": b"spent",
                "value": b"2",
                "headers": [("retry.destination", dest.encode()), ("retry.attempt", b"4")],
            },
            {
                "key": b"broken",
                "value": b"3",
                "headers": [("retry.destination", dest.encode()), ("retry.attempt", b"x")],
            },
        ],
    )

    dag = DagBag(dag_folder=str(ROOT / "dags")).get_dag("retry_scheduler")
    # The two tasks have no order (in production they run side by side, in overlapping runs);
    # dag.test() runs them one after the other in either order, so two runs see everything through.
    runs = [dag.test(run_conf={"loop_seconds": 8}) for _ in range(2)]
    assert [r.state for r in runs] == [DagRunState.SUCCESS, DagRunState.SUCCESS]

    [seen] = consume(bootstrap_servers, [dest], 1)
    assert (seen.key, seen.header(p.ATTEMPT)) == (b"due", "1")
    dead = {
        s.key: s.header(p.DEAD_REASON)
        for s in consume(bootstrap_servers, ["retry.dlq"], 2)
        if s.key in (b"spent", b"broken")
    }
    assert dead == {b"spent": "exhausted", b"broken": "invalid"}

    with psycopg.connect(database_url) as conn:
        rows = dict(conn.execute("SELECT msg_key, status::text FROM retry_jobs_all").fetchall())
    assert rows == {b"due": "published", b"spent": "dead", b"broken": "dead"}

    xcoms = [
        ti.xcom_pull(task_ids=ti.task_id) | {"task": ti.task_id}
        for r in runs
        for ti in r.get_task_instances()
    ]
    ingest = [x for x in xcoms if x["task"] == "ingest"]
    publish = [x for x in xcoms if x["task"] == "publish"]
    assert sum(x["consumed"] for x in ingest) == 3
    assert [x["dead"] for x in ingest if x["consumed"]] == [{"exhausted": 1, "invalid": 1}]
    assert sum(x["published"] for x in publish) == 1
    assert sum(x["dead_published"] for x in publish) == 2
    # Each loop's XCom ends with its run's summary: the slowest batch or round, and the lateness.
    slowest = max((x for x in ingest if x["consumed"]), key=lambda x: x["slowest_batch_s"])
    assert 1 <= slowest["slowest_batch_records"] <= 3 and slowest["slowest_batch_s"] > 0
    [sent] = [x for x in publish if x["published"]]
    assert sent["slowest_round_jobs"] >= 1 and sent["slowest_round_s"] > 0
    assert sent["early"] == 0 and sent["lateness_p50_s"] is not None and sent["lateness_p99_s"] >= 0
    assert {"lateness_max_s", "errors", "claimed", "failed"} <= set(sent)
