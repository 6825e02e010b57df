"""The plans and figures of the PostgreSQL failover's chaos trials (bench/chaos/failover.py): every kind
is planned with what its strike reads, and the figures are the trials' own."""

from __future__ import annotations

import random

import pytest

from bench.chaos.bulk import operation, plan_bulk_fault
from bench.chaos.failover import FAILOVER_FAULTS, plan_failover_fault
from bench.chaos.run import failover_figures
from bench.chaos.topics import Topics
from bench.chaos.trial import Tally, TrialResult, plan_fault


def test_every_kind_is_planned_with_what_its_strike_reads() -> None:
    rng = random.Random(7)
    for fault in FAILOVER_FAULTS:
        for _ in range(20):
            detail = plan_failover_fault(fault, rng, records=2500)
            assert detail["after"] in ("stored", "published") and detail["count"] >= 1, (fault, detail)
            assert 0.5 <= detail["down_s"] <= 3, (fault, detail)
            if fault == "pg_failover_lost_commits":
                assert detail["after"] == "stored" and detail["then_published"] >= 1, detail
        # the trial's own planner hands the kind to the failover's, with no fault inside the workers
        planned = (
            plan_bulk_fault(fault, rng, 2500)
            if fault.endswith("bulk_retry")
            else plan_fault(fault, rng, 2500)
        )
        assert planned[1] in (None, {}), (fault, planned)
    assert operation("pg_failover_bulk_retry", Topics("c001"), "file:///a")[0] == "bulk-retry"
    with pytest.raises(ValueError, match="unknown failover fault"):
        plan_failover_fault("pg_failover_nothing", rng, 2500)


def test_the_figures_are_the_trials_own() -> None:
    def trial(detail: dict) -> TrialResult:
        return TrialResult(0, "x", detail, True, True, 1.0, {}, Tally())

    results = [
        trial({"promoted_s": 2.0, "resumed_s": 1.5, "lost_stored": 0, "lost_published": 0, "kafka_ahead": 0}),
        trial(
            {
                "promoted_s": 3.0,
                "resumed_s": None,
                "lost_stored": 900,
                "lost_published": 100,
                "kafka_ahead": 900,
            }
        ),
        trial({"promoted_s": 1.0, "kafka_ahead": None}),  # a bulk retry: not resumed by itself
    ]
    figures = failover_figures(results)
    assert figures["promoted_s"] == {"trials": 3, "p50": 2.0, "p99": 3.0}
    assert figures["resumed_s"] == {"trials": 1, "p50": 1.5, "p99": 1.5}
    assert figures["lost_commits"] == {
        "trials_with_any": 1, "jobs_stored_lost": 900, "jobs_published_lost": 100, "kafka_offsets_ahead_records": 900,
    }  # fmt: skip
