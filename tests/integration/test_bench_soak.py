"""The benchmark's soak in small: the loop under the real scheduler at a fixed rate, with the lateness
of the first and last windows, and the table and every process's memory sampled (no timing asserted)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench.measure import Sizes
from tests.benchutil import run_measurement

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.cluster]


def test_the_soak_publishes_everything_and_samples_lateness_table_and_memory(
    tmp_path: Path, bootstrap_servers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("bench.soak.RSS_EVERY_S", 2.0)
    sizes = replace(Sizes.quick(), soak_rate=30, soak_seconds=12)
    report = run_measurement(tmp_path, bootstrap_servers, "soak", sizes)
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
    assert details["table_timeline"] and details["table_timeline"][-1][2] > 0
    md = (tmp_path / "report.md").read_text()
    assert "A soak" in md and "Resident memory" in md
    assert (tmp_path / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
