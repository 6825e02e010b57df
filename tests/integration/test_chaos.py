"""The short chaos run of ``make test``: one trial of each fault kind, and the whole bad-input corpus.

The bulk paths are among the kinds: a bulk retry, a compaction and a DLQ replay each killed (-9, the
whole job) mid-way and run again, with every record accounted for on its topics and in the archive.

Each run starts a private PostgreSQL (the machine's binaries, a free port) and a private broker, so
killing, freezing and restarting them disturbs nothing else. ``make chaos`` is the full run (100 trials
of 2 500 records). ``CHAOS_SEED`` replays a seed printed by a failing run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.chaos import FAILOVER_FAULTS, FAULTS, run_chaos
from bench.chaos.bulk import BULK_FAULTS
from retry_scheduler.core import protocol as p

pytestmark = [pytest.mark.integration, pytest.mark.long]

SEED = int(os.environ.get("CHAOS_SEED", "20261121"))


def _failures(report: dict) -> str:
    bad = [t for t in report["trial_results"] if not t["ok"]]
    return f"seed {report['seed']}; failed trials: {json.dumps(bad, indent=1)[:4000]}"


def test_every_fault_kind_loses_nothing_and_duplicates_keep_their_identity(tmp_path: Path) -> None:
    report = run_chaos(trials=len(FAULTS), seed=SEED, records=1000, out_dir=tmp_path, bad_input=False)

    assert json.loads((tmp_path / "chaos.json").read_text())["trials"] == len(FAULTS)
    assert sorted(report["per_fault"]) == sorted(FAULTS)
    assert report["faults_fired"] == len(FAULTS), _failures(report)
    assert report["messages"] == 1000 * len(FAULTS)
    assert report["not_recovered"] == 0, _failures(report)
    assert report["lost"] == 0, _failures(report)
    assert report["duplicates_unidentified"] == 0, _failures(report)
    assert (report["wrong_headers"], report["early"]) == (0, 0), _failures(report)
    # A kill between the broker's ack and the mark re-publishes a whole round: the count is not vacuous.
    assert report["per_fault"]["kill_publish_produced"]["duplicates"] > 0
    assert report["fault_kinds"] == sorted(FAULTS)
    assert {"bulk_retry_kill", "compaction_kill", "dlq_replay_kill", "watched_replay_kill"} <= set(
        report["fault_kinds"]
    )
    bulk = {t["fault"]: t for t in report["trial_results"] if t["fault"] in BULK_FAULTS}
    for fault, trial in bulk.items():
        # killed by its fault plan (SIGKILL), then run again to its end, like Airflow's retry of the task
        assert trial["detail"]["exit_codes"] == [-9, 0], (fault, trial)
        assert trial["starts"]["job"] == 2
    assert bulk["compaction_kill"]["detail"]["archived_jobs"] == 1000  # the whole workload was compacted
    # The breaker trials paused jobs (killed while pausing them, or letting them go) and still lost none,
    # each published with the attempt it had (wrong_headers above counts a spent one).
    for fault in ("kill_breaker_paused", "kill_breaker_let_go"):
        [trial] = [t for t in report["trial_results"] if t["fault"] == fault]
        assert trial["detail"]["held_when_closed"] > 0 and trial["starts"]["publish"] == 2, trial
    assert report["passed"]


def test_every_failover_kind_loses_nothing_and_the_loops_reconnect(tmp_path: Path) -> None:
    """One trial of each PostgreSQL failover kind (``make chaos-failover``), on a primary and a replica."""
    report = run_chaos(
        trials=len(FAILOVER_FAULTS), seed=SEED, records=1000, out_dir=tmp_path, bad_input=False,
        faults=FAILOVER_FAULTS, postgres_failover=True,
    )  # fmt: skip

    assert json.loads((tmp_path / "chaos.json").read_text())["failover"]["trials"] == len(FAILOVER_FAULTS)
    assert report["fault_kinds"] == sorted(FAILOVER_FAULTS)
    assert report["faults_fired"] == len(FAILOVER_FAULTS), _failures(report)
    assert (report["lost"], report["duplicates_unidentified"], report["not_recovered"]) == (0, 0, 0), (
        _failures(report)
    )
    assert (report["wrong_headers"], report["early"]) == (0, 0), _failures(report)
    trials = {t["fault"]: t for t in report["trial_results"]}
    # The replica cut off lost commits for sure: the count is not vacuous.
    lost = trials["pg_failover_lost_commits"]["detail"]
    assert lost["lost_stored"] > 0 and lost["kafka_ahead"] > 0, lost
    for fault, trial in trials.items():
        # The loops' processes went on through the failover (reconnected), none started again.
        assert (trial["starts"]["ingest"], trial["starts"]["publish"]) == (1, 1), (fault, trial)
    assert trials["pg_failover_bulk_retry"]["starts"]["job"] == 2  # cut short, then run again
    assert report["passed"]


def test_every_kind_of_bad_input_ends_dead_with_its_reason_and_the_service_keeps_running(
    tmp_path: Path,
) -> None:
    report = run_chaos(trials=0, seed=SEED, out_dir=tmp_path)
    corpus = report["bad_input"]

    assert report["bad_input_kinds"] >= 30
    failed = [o for o in corpus["outcomes"] if not o["ok"]]
    assert report["bad_input_lost"] == 0, failed
    assert corpus["same_ingest_process"], "the ingest worker died or was restarted during the corpus"
    assert corpus["good_record_after"], "a good record sent after the corpus was not published"
    dead = [o for o in corpus["outcomes"] if o["expected"] == "invalid"]
    assert len(dead) >= 30
    assert all(o["outcome"] == "dead (invalid)" and o["reason"] for o in dead)
    by_kind = {o["kind"]: o for o in corpus["outcomes"]}
    assert (
        by_kind["flood of 10000 headers"]["reason"] == "record has 10000 headers, more than the 256 allowed"
    )
    assert "header retry.at is not valid UTF-8" in by_kind["bad UTF-8 in retry.at"]["reason"]
    # a NUL byte in every retry.* header, each its own kind (once one stopped ingestion for good)
    assert len([k for k in by_kind if k.startswith("NUL byte in retry.")]) == len(p.KNOWN)
    assert "header retry.reason contains a NUL byte" in by_kind["NUL byte in retry.reason"]["reason"]
    assert by_kind["null key and value (a tombstone)"]["outcome"] == "published"
    # Once these halted ingestion for good (a header name over 65 535 bytes) or stored a job due in
    # tens of thousands of years (a record timestamp in microseconds).
    assert "header name is 70000 characters long" in by_kind["header name of 70000 characters"]["reason"]
    for unit in ("nanoseconds", "microseconds", "seconds"):
        assert by_kind[f"record timestamp in {unit}"]["outcome"] == "published"
