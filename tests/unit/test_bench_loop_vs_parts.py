"""loop_vs_parts: the whole loop's CPU per retry at its highest sustained rate over its parts' alone."""

from __future__ import annotations

import pytest

from bench.capacity import cpu_budget, loop_vs_parts
from bench.env import Result


def _capacity(*steps: tuple[int, bool, dict[str, float], int]) -> Result:
    return Result(
        "capacity",
        details={
            "steps": [
                {"rate_per_s": rate, "sustained": sustained, **cpu_budget(cpu_s, retries)}
                for rate, sustained, cpu_s, retries in steps
            ]
        },
    )


def test_the_highest_sustained_step_over_the_parts_measured_alone() -> None:
    capacity = _capacity(
        (
            1_000,
            True,
            {"ingest task": 0.1, "ingest workers": 2.0, "publish task": 3.0, "broker": 9.0},
            60_000,
        ),
        (2_000, True, {"ingest task": 0.1, "ingest workers": 3.9, "publish task": 4.0}, 120_000),
        (4_000, False, {"ingest task": 0.1, "ingest workers": 1.0, "publish task": 1.0}, 240_000),
    )
    ingest = Result("ingest", details={"cpu_us_per_record": 20.0})
    publish = Result("publish", details={"cpu_us_per_record": 25.0})
    loop_vs_parts({"capacity": capacity, "ingest": ingest, "publish": publish})

    # 2 000/s: (0.1 + 3.9 + 4.0) s of the loop's own processes for 120 000 retries (the broker is not
    # the loop's; the unsustained 4 000/s does not count).
    assert capacity.figures["loop_cpu_us_per_retry"] == pytest.approx(66.7)
    assert capacity.figures["loop_vs_parts"] == pytest.approx(66.7 / 45, abs=0.001)
    split = capacity.details["loop_vs_parts"]
    assert split["rate_per_s"] == 2_000
    assert split["loop_ingest_us"] == pytest.approx(33.3) and split["loop_publish_us"] == pytest.approx(33.3)
    assert "1.482x" in capacity.notes[-1] and "ingest 33.3 µs vs 20.0 µs alone" in capacity.notes[-1]


def test_missing_parts_or_no_sustained_rate_say_why() -> None:
    capacity = _capacity((1_000, True, {"publish task": 1.0}, 60_000))
    loop_vs_parts({"capacity": capacity, "ingest": Result("ingest", skipped="not selected with --only")})
    assert capacity.figures["loop_cpu_us_per_retry"] == pytest.approx(16.7)
    assert "loop_vs_parts" not in capacity.figures
    assert capacity.details["why_loop_vs_parts"].startswith("not measured: needs the ingest and publish")

    unsustained = _capacity((1_000, False, {"publish task": 1.0}, 60_000))
    loop_vs_parts({"capacity": unsustained})
    assert unsustained.figures == {} and unsustained.details["why_loop_vs_parts"] == "no rate was sustained"
