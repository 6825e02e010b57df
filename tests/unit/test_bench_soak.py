"""The soak measurement's memory growth and CPU per retry by kind of process."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.cpu import ProcessCpu
from bench.soak import _change, cpu_per_retry_drift, growth, host_speed, per_retry_drift, window_medians


def test_memory_growth_is_of_the_kinds_running_a_third_of_the_way_in_and_at_the_end() -> None:
    samples = [
        [0.0, {"broker": 50.0, "other tasks": 80.0}],
        [1.0, {"broker": 60.0, "other tasks": 90.0, "tiny": 0.5}],
        [2.0, {"broker": 61.0, "publish task": 40.0}],
        [3.0, {"broker": 64.5, "publish task": 41.0}],
    ]
    # "other tasks" ended before the last sample (no growth to tell), "tiny" is under a MB, and
    # "publish task" was not running a third of the way in.
    assert growth(samples) == {"broker": 4.5}
    assert growth(samples[:2]) == {}


def test_cpu_per_retry_of_each_kind_over_the_first_and_the_last_window() -> None:
    # Cumulative CPU seconds by kind, sampled every 10 s of a 40 s run at 1 000 retries/s.
    timeline = [
        [0.0, {}],
        [10.0, {"broker": 1.0, "publish task": 2.0}],
        [20.0, {"broker": 2.5, "publish task": 4.0}],
        [30.0, {"broker": 4.5, "publish task": 6.0, "tiny": 0.0001}],
        [40.0, {"broker": 7.0, "publish task": 8.0, "tiny": 0.0001}],
    ]
    # First 10 s: 1.0 broker CPU-s for 10 000 retries = 100 core-ms per 1 000; last 10 s: 2.5 s.
    assert cpu_per_retry_drift(timeline, rate=1_000, window_s=10) == {
        "broker": {"first": 100.0, "last": 250.0},
        "publish task": {"first": 200.0, "last": 200.0},
    }
    # A kind born mid-run counts from zero; too few samples tell nothing.
    assert cpu_per_retry_drift(timeline[:2], rate=1_000, window_s=10) == {}


def test_postgresql_counters_per_retry_over_the_first_and_the_last_window() -> None:
    # Cumulative counters (not seconds: scale 1), 1 000 retries/s: blocks hit per 1 000 retries rise
    # from 5 000 to 9 000, two checkpoints in the last window and none in the first.
    timeline = [
        [0.0, {"blocks hit": 0, "checkpoints": 0}],
        [10.0, {"blocks hit": 50_000, "checkpoints": 0}],
        [20.0, {"blocks hit": 110_000, "checkpoints": 1}],
        [30.0, {"blocks hit": 180_000, "checkpoints": 1}],
        [40.0, {"blocks hit": 270_000, "checkpoints": 3}],
    ]
    drift = per_retry_drift(timeline, rate=1_000, window_s=10, scale=1.0)
    assert drift == {
        "blocks hit": {"first": 5000.0, "last": 9000.0},
        "checkpoints": {"first": 0.0, "last": 0.2},
    }
    # Sorted by how much they changed: from none to some is the most.
    assert _change(drift["checkpoints"]) == float("inf") > _change(drift["blocks hit"]) == 1.8


def test_the_drift_windows_end_with_the_traffic_not_with_the_benchmark_reading_the_run() -> None:
    # A 40 s run: its traffic ends at 40 s, then the benchmark reads the run back (a full scan of the
    # published jobs: 900 000 rows at once), and the final sample at 55 s holds that reading.
    timeline = [
        [0.0, {"rows returned": 0}],
        [10.0, {"rows returned": 90_000}],
        [20.0, {"rows returned": 180_000}],
        [30.0, {"rows returned": 270_000}],
        [40.0, {"rows returned": 360_000}],
        [55.0, {"rows returned": 1_260_000}],
    ]
    flat = {"rows returned": {"first": 9000.0, "last": 9000.0}}
    assert per_retry_drift(timeline, rate=1_000, window_s=10, scale=1.0, end_s=45.0) == flat
    # Without the end, the last window takes the reading in (what the second soak's report said).
    assert per_retry_drift(timeline, rate=1_000, window_s=10, scale=1.0)["rows returned"]["last"] > 9000
    assert cpu_per_retry_drift(timeline, rate=1_000, window_s=10, end_s=45.0) == {
        "rows returned": {"first": 9_000_000.0, "last": 9_000_000.0}
    }


def test_the_host_speed_is_the_median_cpu_time_of_a_fixed_loop_in_each_window() -> None:
    speed = host_speed()
    assert 0 < speed < 10, speed  # CPU seconds of 2 million additions in a fresh process
    timeline = [[0.0, 0.10], [5.0, 0.12], [10.0, 0.11], [30.0, 0.15], [35.0, 0.13], [40.0, 0.14], [55.0, 9.0]]
    # The last window is 35-45 s: the samples at 35 and 40 s (55 s is the reading after the traffic).
    assert window_medians(timeline, window_s=10, end_s=45.0) == {"first": 0.11, "last": 0.135}
    assert window_medians(timeline[:1], window_s=10, end_s=45.0) == {"first": 0.1, "last": None}


@pytest.mark.serial  # other tests' processes running beside it would count as 'other' too
def test_the_running_cpu_of_a_live_child_is_read_while_the_window_runs() -> None:
    # A real child process spinning, read before it ends (no parent accounting yet).
    spin = (
        "import time\nend = time.process_time() + 1.5\nwhile time.process_time() < end: pass\ntime.sleep(5)"
    )
    with ProcessCpu(interval_s=0.05) as cpu:
        child = subprocess.Popen([sys.executable, "-c", spin])
        try:
            deadline = time.monotonic() + 20
            while cpu.running_seconds().get("other", 0) < 1.0 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert cpu.running_seconds().get("other", 0) >= 1.0, cpu.running_seconds()
        finally:
            child.kill()
            child.wait()
