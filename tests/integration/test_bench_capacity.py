"""The benchmark's capacity measurement in small: the rate steps under the real scheduler (alone on
the machine: a step is sustained only when its lateness stays under a second) and, in a run of their
own beside other tests, the publish runs on one and two Celery workers; with what the report says of
them (no timing asserted beyond the steps' second)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench.measure import Sizes
from tests.benchutil import run_measurement

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.cluster]


@pytest.mark.serial
def test_capacity_steps_the_rate_under_the_scheduler(tmp_path: Path, bootstrap_servers: str) -> None:
    sizes = replace(Sizes.quick(), capacity_rates=(20, 40), capacity_seconds=8, capacity_celery_workers=())
    report = run_measurement(tmp_path, bootstrap_servers, "capacity", sizes)
    capacity = report["measurements"]["capacity"]

    steps = capacity["details"]["steps"]
    assert [s["rate_per_s"] for s in steps] == [20, 40]  # both low rates are sustained: no early stop
    for step in steps:
        assert step["sent"] >= step["rate_per_s"] * 8 * 0.9 and step["published"] == step["sent"], step
        assert step["early"] == 0 and step["sustained"], step
        # The CPU budget found the loops' processes by their titles, and Airflow's own beside them.
        budget = step["core_ms_per_1000"]
        assert budget["publish task"] > 0 and budget["airflow scheduler"] > 0, budget
        assert budget.get("ingest task", 0) + budget.get("ingest workers", 0) > 0, budget
        assert step["loop_cpu_us_per_retry"] > 0, step
        # Lateness second by second of due time, every published record in it; the loops' task starts.
        assert sum(n for _at, n, _p99, _max in step["timeline"]) == step["published"], step["timeline"]
        assert all(-1 <= at <= 8 + 10 and p99 <= worst for at, _n, p99, worst in step["timeline"])
        assert step["task_starts"] and {t for t, _ in step["task_starts"]} <= {"ingest", "publish"}, step
        assert all(t in ("ingest", "publish") and at >= 0 for t, at in step["task_ends"]), step
        assert step["late_seconds"] == [], step["late_seconds"]
        # By 30 s of due time too; the rise needs three minutes of due times.
        assert sum(n for _at, n, _p99 in step["p99_by_slice"]) == step["published"], step["p99_by_slice"]
        assert step["p99_rise_s"] is None
        # The ingest's gaps: the widest in the window (records come 20-40 a second), each handover's.
        assert 0 < step["store_gap_max_s"] <= step["seconds"], step
        assert all(0 < gap <= step["store_gap_max_s"] for gap in step["handover_gaps_s"]), step
        # A consumer followed the destination: every record reached it, none before its due time.
        assert step["at_consumer_received"] >= step["published"] and step["at_consumer_early"] == 0, step
        assert 0 <= step["at_consumer_p50_s"] <= step["at_consumer_p99_s"] <= step["at_consumer_max_s"]
        assert step["rss_mib"]["broker"][1] > 0, step["rss_mib"]  # the tests' broker, a local JVM
    assert report["sustained_retries_per_s"] == 40
    assert report["targets"]["sustained_retries_per_s"]["target"] == 10_000
    # The same figure again under its autovacuum name only where the server ran with autovacuum on.
    if capacity["details"]["autovacuum"]:
        assert report["sustained_retries_per_s_autovacuum_on"] == 40
    else:
        assert report["sustained_retries_per_s_autovacuum_on"] is None
        assert "autovacuum off" in report["not_measured"]["sustained_retries_per_s_autovacuum_on"]
    # The loop's own CPU per retry at the highest sustained rate; loop_vs_parts needs ingest and
    # publish measured alone in the same run, which this one did not.
    assert report["loop_cpu_us_per_retry"] == steps[-1]["loop_cpu_us_per_retry"]
    assert (
        report["loop_vs_parts"] is None
        and "needs the ingest and publish" in report["not_measured"]["loop_vs_parts"]
    )

    assert capacity["details"]["celery"] == []
    assert "publish_rows_per_s_1_worker" not in report["measurements"]["capacity"]["figures"]
    md = (tmp_path / "report.md").read_text()
    assert "Capacity under the Airflow scheduler" in md
    assert "CPU at 40/s, core-milliseconds per 1 000 retries: " in md
    assert "At 40/s no second of due time had a record later than 1 s." in md
    assert "At 40/s the p99 of each 30 s of due time was " in md
    assert "A consumer following the destination received " in md
    assert (tmp_path / "capacity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # lateness over time


def test_capacity_publishes_on_one_and_two_celery_workers(tmp_path: Path, bootstrap_servers: str) -> None:
    sizes = replace(Sizes.quick(), capacity_rates=(), capacity_publish_rows=1_000)
    report = run_measurement(tmp_path, bootstrap_servers, "capacity", sizes)
    capacity = report["measurements"]["capacity"]

    celery = capacity["details"]["celery"]
    assert [c["workers"] for c in celery] == [1, 2]
    assert all(c["rows"] == 1_000 and c["rows_per_s"] > 0 for c in celery), celery
    assert report["publish_rows_per_s_1_worker"] == celery[0]["rows_per_s"]
    assert report["publish_rows_per_s_2_workers"] == celery[1]["rows_per_s"]
    # The steps were not run: their figures say so rather than report 0.
    assert capacity["details"]["steps"] == [] and report["sustained_retries_per_s"] is None
    assert "no capacity rates were given" in report["not_measured"]["sustained_retries_per_s"]
    md = (tmp_path / "report.md").read_text()
    assert "Capacity under the Airflow scheduler" in md and "rows/s on 1 worker, " in md
    assert "rows/s on 2 workers (first acknowledgement" in md
