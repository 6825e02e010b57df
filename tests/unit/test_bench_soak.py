"""The soak measurement's memory growth by kind of process."""

from __future__ import annotations

from bench.soak import growth


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
