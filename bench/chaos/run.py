"""The chaos run: the bad-input corpus, then the trials, and chaos.json."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.chaos.bad_input import BadInputResult, run_bad_input
from bench.chaos.bulk import BULK_PATH_FAULTS, run_bulk_trial
from bench.chaos.common import (
    DELIVERY_TIMEOUT_MS,
    FAULTS,
    INGEST_BATCH,
    INGEST_WORKERS,
    LEASE_MS,
    PUBLISH_BATCH,
    RESTART_DELAY_S,
    Say,
)
from bench.chaos.stack import ChaosStack
from bench.chaos.trial import Tally, TrialResult, run_trial
from retry_scheduler.dev.kafka_libs import KAFKA_VERSION

log = logging.getLogger(__name__)


def machine(cluster: bool = False) -> dict[str, Any]:

    import confluent_kafka

    mem_kb = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kb = int(Path("/proc/meminfo").read_text().split("\n", 1)[0].split()[1])
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "librdkafka": confluent_kafka.libversion()[0],
        "broker": f"Apache Kafka {KAFKA_VERSION} (KRaft, "
        + ("three brokers and two controllers only" if cluster else "one node")
        + ", the dev tooling's)",
    }


def run_chaos(
    *,
    trials: int = 100,
    seed: int | None = None,
    records: int = 2500,
    out_dir: Path | None = None,
    bad_input: bool = True,
    faults: Sequence[str] = FAULTS,
    say: Say = print,
    cluster: bool = False,
    postgres_failover: bool = False,
) -> dict[str, Any]:
    """Run the bad-input corpus and ``trials`` fault trials; write ``chaos.json`` to ``out_dir``.

    ``cluster``: the trials of a Kafka cluster failing (:mod:`bench.chaos.cluster`), on three
    brokers and two controllers only; their report is the ``cluster`` entry of ``chaos.json``.
    ``postgres_failover``: the trials of the PostgreSQL primary failing (:mod:`bench.chaos.failover`),
    on a primary and a streaming replica; the ``failover`` entry."""
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    rng = random.Random(seed)
    say(f"chaos: seed {seed} (rerun with --seed {seed}), {trials} trials of {records} records")
    began = time.monotonic()
    work_dir = Path(tempfile.mkdtemp(prefix="retry-chaos-"))
    stack = ChaosStack(work_dir, say, cluster=cluster, postgres_pair=postgres_failover)
    results: list[TrialResult] = []
    corpus: BadInputResult | None = None
    pg_version = "?"
    try:
        stack.start()
        pg_version = stack.server_version()
        if bad_input:
            corpus = run_bad_input(stack)
            say(
                f"bad input: {corpus.kinds} kinds, {corpus.lost} not as expected, same ingest process "
                f"{corpus.same_ingest_process}, good record after them {corpus.good_record_after} ({corpus.seconds:.0f} s)"
            )
            for outcome in corpus.outcomes:
                if not outcome["ok"]:
                    say(f"  {outcome['kind']}: {outcome.get('problem')} (reason {outcome.get('reason')!r})")
        order: list[str] = []
        while len(order) < trials:
            cycle = list(faults)
            rng.shuffle(cycle)
            order += cycle
        for index, fault in enumerate(order[:trials]):
            trial = run_bulk_trial if fault in BULK_PATH_FAULTS else run_trial
            result = trial(stack, index, fault, random.Random(rng.randrange(2**63)), records)
            results.append(result)
            t = result.tally
            say(
                f"trial {index + 1:>3}/{trials} {fault:<25} {json.dumps(result.detail)}: "
                f"{'fired' if result.fired else 'NOT FIRED'}, {'recovered' if result.recovered else 'NOT RECOVERED'} "
                f"in {result.seconds:.1f} s, lost {t.lost}, duplicates {t.duplicates} "
                f"({t.duplicates_unidentified} unidentified), restarts {result.starts}"
                + ("" if t.ok else f"  {t.examples}")
            )
    finally:
        stack.stop()
    failed = [r for r in results if not (r.recovered and r.tally.ok)]
    if failed or (corpus and not corpus.ok) or os.environ.get("CHAOS_KEEP") == "1":
        say(f"chaos: kept {work_dir} (worker logs in logs/, PostgreSQL data in postgres/) for a look")
    else:
        shutil.rmtree(work_dir, ignore_errors=True)
    report = summarize(results, corpus, seed=seed, records=records, seconds=time.monotonic() - began)
    report["machine"] = {**machine(cluster), "postgresql": pg_version}
    if cluster:
        report["cluster_figures"] = cluster_figures(results)
    if postgres_failover:
        report["machine"]["postgresql"] += " (a primary and a streaming replica, asynchronous)"
        report["failover_figures"] = failover_figures(results)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        previous = out_dir / "chaos.json"
        earlier: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError, AttributeError):
            earlier = json.loads(previous.read_text())
        if cluster or postgres_failover:  # entries of their own; the rest is kept
            written = {**earlier, ("cluster" if cluster else "failover"): report}
        else:  # the entries of ordered mode (make chaos-ordered), the cluster and the failover are kept
            kept = ("ordered", "ordered_cluster", "cluster", "failover")
            written = {**report, **{k: earlier.get(k) for k in kept}}
        previous.write_text(json.dumps(written, indent=2) + "\n")
        say(f"chaos: wrote {out_dir / 'chaos.json'}")
    return report


def _percentile(values: Sequence[float], q: float) -> float | None:
    ordered = sorted(values)
    return None if not ordered else ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _spread(results: Sequence[TrialResult], name: str) -> dict[str, Any]:
    """The p50 and p99 of the figure ``name`` over the trials that noted one."""
    values = [r.detail[name] for r in results if r.detail.get(name) is not None]
    return {"trials": len(values), "p50": _percentile(values, 0.5), "p99": _percentile(values, 0.99)}


def cluster_figures(results: Sequence[TrialResult]) -> dict[str, Any]:
    """The cluster trials' own figures: how long a partition had no leader after its leader was
    killed or frozen, how long until it got a record again, and the lateness during rolling restarts."""
    rolling = [r.detail["lateness_p99_s"] for r in results if r.detail.get("lateness_p99_s") is not None]
    return {
        "failover_s": _spread(results, "failover_s"),
        "resumed_s": _spread(results, "resumed_s"),
        "rolling_restart_lateness_p99_s": {"trials": len(rolling), "max": max(rolling, default=None)},
        "no_leader_in_time": sum(
            1 for r in results if "failover_s" in r.detail and r.detail["failover_s"] is None
        ),
    }


def failover_figures(results: Sequence[TrialResult]) -> dict[str, Any]:
    """The failover trials' own figures: how long until the replica took writes, until a job was
    published again, and what the promoted replica lacked (commits lost, Kafka offsets ahead)."""

    def total(name: str) -> int:
        return sum(int(r.detail.get(name) or 0) for r in results)

    return {
        "promoted_s": _spread(results, "promoted_s"),
        "resumed_s": _spread(results, "resumed_s"),
        "lost_commits": {
            "trials_with_any": sum(
                1 for r in results if (r.detail.get("lost_stored") or r.detail.get("lost_published"))
            ),
            "jobs_stored_lost": total("lost_stored"),
            "jobs_published_lost": total("lost_published"),
            "kafka_offsets_ahead_records": total("kafka_ahead"),
        },
    }


def summarize(
    results: Sequence[TrialResult], corpus: BadInputResult | None, *, seed: int, records: int, seconds: float
) -> dict[str, Any]:
    total = Tally()
    per_fault: dict[str, dict[str, Any]] = {}
    for result in results:
        total.add(result.tally)
        entry = per_fault.setdefault(
            result.fault, {"trials": 0, "fired": 0, "recovered": 0, "lost": 0, "duplicates": 0,
                           "duplicates_unidentified": 0, "worker_restarts": 0, "max_seconds": 0.0},
        )  # fmt: skip
        entry["trials"] += 1
        entry["fired"] += result.fired
        entry["recovered"] += result.recovered
        entry["lost"] += result.tally.lost
        entry["duplicates"] += result.tally.duplicates
        entry["duplicates_unidentified"] += result.tally.duplicates_unidentified
        entry["worker_restarts"] += sum(result.starts.values()) - len(result.starts)
        entry["max_seconds"] = max(entry["max_seconds"], result.seconds)
    not_recovered = sum(not r.recovered for r in results)
    passed = (
        total.lost == 0
        and total.duplicates_unidentified == 0
        and total.wrong_headers == 0
        and total.early == 0
        and not_recovered == 0
        and (corpus is None or corpus.ok)
    )
    return {
        "passed": passed,
        "trials": len(results),
        "messages": total.records,
        "lost": total.lost,
        "duplicates": total.duplicates,
        "duplicates_unidentified": total.duplicates_unidentified,
        "bad_input_kinds": corpus.kinds if corpus else 0,
        "bad_input_lost": corpus.lost if corpus else 0,
        "misrouted": total.misrouted,
        "wrong_headers": total.wrong_headers,
        "early": total.early,
        "not_recovered": not_recovered,
        "source_duplicates": total.source_duplicates,
        "faults_fired": sum(r.fired for r in results),
        "fault_kinds": sorted(per_fault),
        "seed": seed,
        "records_per_trial": records,
        "duration_s": round(seconds, 1),
        "settings": {
            "ingest_batch": INGEST_BATCH,
            "ingest_workers": INGEST_WORKERS,
            "publish_batch": PUBLISH_BATCH,
            "lease_ms": LEASE_MS,
            "delivery_timeout_ms": DELIVERY_TIMEOUT_MS,
            "restart_delay_s": RESTART_DELAY_S,
        },
        "per_fault": per_fault,
        "bad_input": None
        if corpus is None
        else {
            "kinds": corpus.kinds,
            "lost": corpus.lost,
            "same_ingest_process": corpus.same_ingest_process,
            "good_record_after": corpus.good_record_after,
            "outcomes": corpus.outcomes,
        },
        "trial_results": [r.as_json() for r in results],
    }
