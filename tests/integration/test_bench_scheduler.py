"""The benchmark's measurements under the real scheduler in small, in one run on one dev stack: a
snapshot held open (with a Spark bulk retry beside it too), a burst sent to the retry topic of the steady traffic, and a soak; with what the
report says of each (no timing asserted). The capacity measurement (serial) is tested apart."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer

from bench.measure import Sizes
from tests.benchutil import run_measurement

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.cluster]

Run = tuple[dict[str, Any], Path]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, bootstrap_servers: str) -> Iterator[Run]:
    """One ``--quick`` run of the three, sharing one stack (its start is most of what each costs):
    its report.json and the folder of its report."""
    out = tmp_path_factory.mktemp("bench-scheduler")
    sizes = replace(
        Sizes.quick(),
        held_rate=30,
        held_seconds=8,
        held_spark_rows=1_500,
        burst_records=2_000,
        burst_send_rate=500,
        burst_due_s=8,
        burst_steady_rate=30,
        burst_baseline_s=6,
        soak_rate=30,
        soak_seconds=12,
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("bench.soak.RSS_EVERY_S", 2.0)
        patch.setattr("bench.soak.CPU_EVERY_S", 2.0)
        yield run_measurement(out, bootstrap_servers, ("held_snapshot", "burst", "soak"), sizes), out


def _retry_ids(bootstrap: str, topic: str, expected: int, timeout_s: float = 60) -> set[bytes]:
    """The distinct ``retry.id`` headers of ``topic``'s records, read from the beginning until
    ``expected`` of them were seen and the topic was quiet for a second, or ``timeout_s``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-read-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    ids: set[bytes] = set()
    deadline, quiet_since = time.monotonic() + timeout_s, time.monotonic()
    try:
        while time.monotonic() < deadline and not (
            len(ids) >= expected and time.monotonic() - quiet_since > 1
        ):
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            quiet_since = time.monotonic()
            ids.update(value for key, value in msg.headers() or [] if key == "retry.id")
    finally:
        consumer.close()
    return ids


def test_the_held_snapshot_windows_publish_everything_and_show_the_snapshot_held(
    run: Run, bootstrap_servers: str
) -> None:
    report, out = run
    held = report["measurements"]["held_snapshot"]

    baseline, with_snapshot, with_spark = held["details"]["windows"]
    assert [w["window"] for w in (baseline, with_snapshot, with_spark)] == ["baseline", "held", "spark"]
    for window in (baseline, with_snapshot, with_spark):
        assert window["sent"] >= 30 * 8 * 0.9 and window["published"] == window["sent"], window
        assert window["early"] == 0 and window["published_per_s"] > 0, window
        # retry_jobs sampled from the window's start: [at, dead, live, table MB, index MB, snapshot age]
        table = window["table_timeline"]
        # retry_jobs holds pending and dead jobs only (published ones move out): its live rows may
        # be none once a window's jobs are all published, but not at every sample.
        assert len(table) >= 2 and table[0][0] < 1 and max(row[2] for row in table) > 0, table
        assert table[-1][3] > 0, table
        # Within the stated bounds: at most 2 dead row versions (and 1 KiB) per job of the window.
        bounds = window["bounds"]
        assert bounds["within"] is True and bounds["dead_rows"] <= bounds["dead_rows_bound"], bounds
        # Records sent a minute overdue were stored and published, none of them due when stored.
        overdue = window["overdue"]
        assert overdue["sent"] > 0 and overdue["published"] == overdue["sent"], overdue
        assert overdue["not_overdue"] == 0 and 0 <= overdue["p50_s"] <= overdue["p99_s"] <= overdue["max_s"]
        # What would explain a stall is sampled; a window that missed keeps its logs beside the report.
        assert isinstance(window["slow_statements"], list), window["slow_statements"]
        if window["p99_s"] > 1.0:
            assert Path(window["logs"]).parent == out and (Path(window["logs"]) / "stack").is_dir(), window
        else:
            assert "logs" not in window
    assert with_spark["bounds"]["jobs"] == with_spark["sent"] + with_spark["overdue"]["sent"] + 1_500
    assert report["held_snapshot_overdue_p99_s"] == with_snapshot["overdue"]["p99_s"]
    # The snapshot really was held: the oldest snapshot grew older through the held windows only
    # (the Spark bulk retry ran while it was held).
    for window in (with_snapshot, with_spark):
        held_age = [row[5] for row in window["table_timeline"]]
        assert held_age[-1] > held_age[0], window["table_timeline"]
        assert held_age[-1] > max(row[5] for row in baseline["table_timeline"])
    assert report["held_snapshot_p99_s"] == with_snapshot["p99_s"] is not None
    assert report["held_snapshot_throughput_ratio"] == pytest.approx(
        with_snapshot["published_per_s"] / baseline["published_per_s"], abs=0.001
    )
    assert report["targets"]["held_snapshot_p99_s"]["target"] == 1.0
    # The Spark bulk retry ran inside the third window and published every dead job it was given
    # (their destination's rows, read back here); the figures are of the records due meanwhile.
    job = with_spark["spark"]
    assert job["code"] == 0 and job["result"]["published"] == 1_500, job
    assert job["by_status"] == {"published": 1_500}, job
    # It starts with the window (its thread a moment before the step's clock) and ends inside it or after.
    assert -5 < job["from_s"] < job["to_s"], job
    # At the sink: the destination topic holds every one of them (at least once).
    assert len(_retry_ids(bootstrap_servers, job["destination"], 1_500)) == 1_500
    during = job["during"]
    assert during["published"] > 0 and during["early"] == 0, during
    assert report["held_snapshot_spark_p99_s"] == during["p99_s"] is not None
    assert report["held_snapshot_spark_throughput_ratio"] == pytest.approx(
        during["published_per_s"] / baseline["published_per_s"], abs=0.001
    )
    md = (out / "report.md").read_text()
    assert "A snapshot held open" in md and "held: " in md and "oldest snapshot" in md
    assert (out / "held_snapshot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_burst_is_stored_and_published_from_the_steady_traffics_topic_and_the_steady_traffic_goes_on(
    run: Run,
) -> None:
    report, out = run
    burst = report["measurements"]["burst"]
    details = burst["details"]

    # Every burst record was stored and published, none before its due time: each was due
    # burst_due_s after it was sent (their due times span the send), on the steady traffic's topic.
    assert details["burst"]["stored"] == details["burst"]["published"] == 2_000, details["burst"]
    assert details["burst"]["early"] == 0
    assert details["topic"] == "retry" and details["due_s"] == 8
    # Sent at the stated rate (paced each thousand: the second thousand not before 2 s).
    assert details["send_rate"] == 500 and details["send_s"] >= 2.0, details
    assert 0 <= details["burst"]["due_span_s"] <= details["send_s"] + 1, details
    stored = sum(row[1] for row in details["burst_timeline"])
    published = sum(row[2] for row in details["burst_timeline"])
    assert stored == published == 2_000
    # The burst's first acknowledgement came no sooner than burst_due_s after it began. The timeline's
    # seconds are whole epoch seconds (floored: up to 1 s) less the run's start, rounded (up to 0.5 s):
    # an acknowledgement 8.0 s after the burst began may show 1.5 s sooner. (Each record's own due
    # time is checked exactly: early == 0 above.)
    first_ack = next(row[0] for row in details["burst_timeline"] if row[2])
    assert first_ack >= details["burst_began_s"] + 8 - 1.5, details["burst_timeline"]

    steady = details["steady"]
    assert steady["sent"] >= 30 * 6 * 0.9 and steady["published"] == steady["sent"], steady
    assert steady["early"] == 0
    # Steady records fell due before, during and after the burst: each span has its own figures.
    for span in ("before_burst", "during_burst", "after_burst"):
        assert steady[span]["published"] > 0 and steady[span]["early"] == 0, (span, steady[span])
    assert (
        steady["before_burst"]["published"]
        + steady["during_burst"]["published"]
        + steady["after_burst"]["published"]
        == steady["published"]
    )
    assert report["burst_steady_p99_s"] == steady["during_burst"]["p99_s"] is not None
    assert report["burst_steady_baseline_p99_s"] == steady["before_burst"]["p99_s"] is not None
    assert report["burst_publish_late_s"] == details["burst"]["max_s"] >= 0
    assert report["burst_ingest_msgs_per_s"] == pytest.approx(2_000 / details["ingest_s"], rel=0.01)
    assert report["targets"]["burst_ingest_msgs_per_s"]["target"] == 30_000
    assert details["core_ms_per_1000"] and details["table_timeline"]
    # The window in which the burst was sent and stored has its own CPU budget, the burst's producer
    # process counted as the load generator.
    window = details["store_window_cpu"]
    # (With one retry topic a small run's ingest may run in its task's process, not in ingest workers.)
    service = {k: v for k, v in window["core_s"].items() if k not in ("load generator", "broker")}
    assert window["core_s"].get("load generator", 0) > 0 and sum(service.values()) > 0, window
    assert window["machine_cpu"]["busy_pct"] > 0, window
    md = (out / "report.md").read_text()
    assert "While the burst was sent and stored" in md
    assert "A burst of a million retries" in md and "steady traffic alone: p99" in md
    assert (out / "burst.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_soak_publishes_everything_and_samples_lateness_table_and_memory(run: Run) -> None:
    report, out = run
    soak = report["measurements"]["soak"]
    details = soak["details"]
    step = details["step"]
    assert step["sent"] >= 30 * 12 * 0.9 and step["published"] == step["sent"] and step["early"] == 0, step
    # The first and last quarter of the run (a fifth-of-an-hour window in a full run) each had records.
    assert details["drift_window_s"] == 3
    first, last = details["spans"]["first"], details["spans"]["last"]
    assert first["published"] > 0 and last["published"] > 0
    assert report["soak_p99_drift"] == pytest.approx(last["p99_s"] / first["p99_s"], abs=0.001)
    assert report["targets"]["soak_p99_drift"]["target"] == 1.2
    # Memory by kind of process: the loops' tasks, PostgreSQL and the broker among them, each sample.
    rss = details["rss_timeline"]
    assert len(rss) >= 3 and rss[0][0] < 1
    kinds = set(rss[-1][1])
    assert {"broker", "PostgreSQL: service", "airflow scheduler"} <= kinds, kinds
    assert all(mb > 0 for _at, by_kind in rss for mb in by_kind.values())
    assert set(details["rss_growth_mb"]) <= kinds
    # retry_jobs' live rows (pending and dead: published jobs move out) at some sample; its size at the end
    table = details["table_timeline"]
    assert table and max(row[2] for row in table) > 0 and table[-1][3] > 0, table
    # CPU by kind over time: cumulative, sampled from the start, the loops' work among it.
    cpu = details["cpu_timeline"]
    assert len(cpu) >= 4 and cpu[0][0] < 1, cpu
    assert cpu[-1][1]["publish task"] >= cpu[len(cpu) // 2][1].get("publish task", 0) > 0, cpu
    assert {"publish task", "broker"} <= set(details["cpu_drift"]), details["cpu_drift"]
    # PostgreSQL's own counters, sampled as often: the rows the ingest stored among them, per retry.
    pg = details["pg_activity_timeline"]
    assert len(pg) >= 4 and pg[-1][1]["rows inserted"] > pg[0][1]["rows inserted"], pg
    assert details["pg_activity_drift"]["rows inserted"]["last"] > 0, details["pg_activity_drift"]
    # The host's speed, timed in a fresh process at each sample, in both windows.
    assert len(details["host_speed_timeline"]) >= 3, details["host_speed_timeline"]
    assert all(v and v > 0 for v in details["host_speed_drift"].values()), details["host_speed_drift"]
    md = (out / "report.md").read_text()
    assert "A soak" in md and "Resident memory" in md and "core-ms per 1 000 retries in the first" in md
    assert "PostgreSQL's work per 1 000 retries" in md and "The host's speed" in md
    assert (out / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
