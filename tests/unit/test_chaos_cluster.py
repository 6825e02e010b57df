"""The plans and figures of the cluster's chaos trials (bench/chaos/cluster.py): every kind is planned
with what its strike reads, and the figures are the trials' own."""

from __future__ import annotations

import random

from bench.chaos.cluster import CLUSTER_FAULTS, plan_cluster_fault
from bench.chaos.run import cluster_figures
from bench.chaos.trial import Tally, TrialResult


def test_every_kind_is_planned_with_what_its_strike_reads() -> None:
    rng = random.Random(5)
    for fault in CLUSTER_FAULTS:
        for _ in range(20):
            detail = plan_cluster_fault(fault, rng, records=2500)
            assert detail["after"] in ("stored", "published") and detail["count"] >= 1, (fault, detail)
            if "_kill" in fault or fault == "two_brokers_down":
                assert 2 <= detail["down_s"] <= 10, (fault, detail)
            if fault.startswith("leader_kill") or fault == "broker_freeze":
                assert detail["partition"] in range(6 if fault == "leader_kill_retry" else 3), (fault, detail)
            if fault == "broker_freeze":
                assert 10 <= detail["frozen_s"] <= 15, detail


def test_the_figures_are_the_percentiles_of_what_the_trials_noted() -> None:
    def trial(detail: dict) -> TrialResult:
        return TrialResult(0, "x", detail, True, True, 1.0, {}, Tally())

    results = [
        trial({"failover_s": 9.0, "resumed_s": 9.5}),
        trial({"failover_s": 11.0, "resumed_s": None}),
        trial({"failover_s": None}),  # no new leader in time
        trial({"lateness_p99_s": 4.5}),
        trial({"lateness_p99_s": 3.0}),
        trial({}),
    ]
    figures = cluster_figures(results)
    assert figures["failover_s"] == {"trials": 2, "p50": 11.0, "p99": 11.0}
    assert figures["resumed_s"] == {"trials": 1, "p50": 9.5, "p99": 9.5}
    assert figures["rolling_restart_lateness_p99_s"] == {"trials": 2, "max": 4.5}
    assert figures["no_leader_in_time"] == 1
