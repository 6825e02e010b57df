"""The benchmark's held-snapshot measurement in small: the loop under the real scheduler alone, then
while a REPEATABLE READ transaction holds its snapshot, with what the report says (no timing asserted)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench.measure import Sizes
from tests.benchutil import run_measurement

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.cluster]


def test_the_held_snapshot_windows_publish_everything_and_show_the_snapshot_held(
    tmp_path: Path, bootstrap_servers: str
) -> None:
    sizes = replace(Sizes.quick(), held_rate=30, held_seconds=8)
    report = run_measurement(tmp_path, bootstrap_servers, "held_snapshot", sizes)
    held = report["measurements"]["held_snapshot"]

    baseline, with_snapshot = held["details"]["windows"]
    assert (baseline["window"], with_snapshot["window"]) == ("baseline", "held")
    for window in (baseline, with_snapshot):
        assert window["sent"] >= 30 * 8 * 0.9 and window["published"] == window["sent"], window
        assert window["early"] == 0 and window["published_per_s"] > 0, window
        # retry_jobs sampled from the window's start: [at, dead, live, table MB, index MB, snapshot age]
        table = window["table_timeline"]
        assert len(table) >= 2 and table[0][0] < 1 and table[-1][2] > 0 and table[-1][3] > 0, table
    # The snapshot really was held: the oldest snapshot grew older through the held window only.
    held_age = [row[5] for row in with_snapshot["table_timeline"]]
    assert held_age[-1] > held_age[0] and held_age[-1] > max(row[5] for row in baseline["table_timeline"])
    assert report["held_snapshot_p99_s"] == with_snapshot["p99_s"] is not None
    assert report["held_snapshot_throughput_ratio"] == pytest.approx(
        with_snapshot["published_per_s"] / baseline["published_per_s"], abs=0.001
    )
    assert report["targets"]["held_snapshot_p99_s"]["target"] == 1.0
    md = (tmp_path / "report.md").read_text()
    assert "A snapshot held open" in md and "held: " in md and "oldest snapshot" in md
    assert (tmp_path / "held_snapshot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
