"""The benchmark's burst measurement in small: steady traffic alone, then through a burst sent to a
delay topic, under the real scheduler, with what the report says (no timing asserted)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench.measure import Sizes
from tests.benchutil import run_measurement

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.cluster]


def test_the_burst_is_stored_and_published_from_its_delay_topic_and_the_steady_traffic_goes_on(
    tmp_path: Path, bootstrap_servers: str
) -> None:
    sizes = replace(
        Sizes.quick(), burst_records=2_000, burst_due_s=8, burst_steady_rate=30, burst_baseline_s=6
    )
    report = run_measurement(tmp_path, bootstrap_servers, "burst", sizes)
    burst = report["measurements"]["burst"]
    details = burst["details"]

    # Every burst record was stored and published, none before its due time: the delay topic's
    # delay made them due burst_due_s after they were sent (their due times span the send).
    assert details["burst"]["stored"] == details["burst"]["published"] == 2_000, details["burst"]
    assert details["burst"]["early"] == 0
    assert details["topic"] == "retry.burst" and details["due_s"] == 8
    assert 0 <= details["burst"]["due_span_s"] <= details["send_s"] + 1, details
    stored = sum(row[1] for row in details["burst_timeline"])
    published = sum(row[2] for row in details["burst_timeline"])
    assert stored == published == 2_000
    # The burst's first acknowledgement came no sooner than burst_due_s after it began.
    first_ack = next(row[0] for row in details["burst_timeline"] if row[2])
    assert first_ack >= details["burst_began_s"] + 8 - 1, details["burst_timeline"]

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
    md = (tmp_path / "report.md").read_text()
    assert "A burst of a million retries" in md and "steady traffic alone: p99" in md
    assert (tmp_path / "burst.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
