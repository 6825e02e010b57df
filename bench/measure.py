"""``retry-scheduler bench``: measure the service against baselines run in the same process and run.

Every figure is measured on the real PostgreSQL (a throwaway database, ``retry_bench``, migrated
with :func:`retry_scheduler.db.store.migrate` and dropped at the end) and a Kafka
broker (the dev tooling's Apache Kafka 4.4, on a free port), through the service's own code paths:
:class:`~retry_scheduler.loops.ingest.Ingestor` fed from a real retry topic, and
:class:`~retry_scheduler.loops.publish.Publisher` on due jobs stored with
:func:`bench.jobs.insert_jobs` (the ingest's own ``Queue.insert_rows``). Each baseline runs right after its figure, on the
same server, with the same rows. The report (``report.json``, ``report.md``, PNG plots) is written
by :mod:`bench.report`; the baselines live in :mod:`bench.baselines`. The ingest measurement is here;
the others are in their own modules (:mod:`bench.publish`, :mod:`bench.claim`, :mod:`bench.slow`, ...).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.cpu import ProcessCpu, part_cpu
from bench.env import (
    BENCH_POLICIES,
    MEASUREMENTS,
    PARTITIONS,
    BenchEnv,
    BenchError,
    Result,
    per_second,
    produce_records,
    ratio,
    retry_record,
)
from bench.machine import machine_info
from bench.queries import bq
from bench.sizes import Sizes
from retry_scheduler.core.config import Settings
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.db.connection import connect
from retry_scheduler.db.store import Store
from retry_scheduler.loops.ingest import Ingestor

log = logging.getLogger(__name__)


def measure_ingest(env: BenchEnv, sizes: Sizes) -> Result:
    """Ingest a retry topic into ``retry_jobs``; baseline: a binary COPY of the same rows."""
    from bench.baselines import copy_baseline

    result = Result("ingest")
    settings = env.settings("ingest")
    total = sizes.ingest_records + sizes.ingest_warmup
    env.sql("bench_truncate")
    env.create_topics([settings.retry_topic])
    destination = f"bench.orders-{env.tag}"
    # Due in a day: the jobs stay pending, so the publish loop (not running here) would find nothing.
    at_ms = int(time.time() * 1000) + 86_400_000
    bootstrap = env.bootstrap or ""
    produce_records(bootstrap, settings.retry_topic, sizes.ingest_warmup, destination, at_ms)

    store = Store(settings.database_url)
    began = time.perf_counter()
    ingestor = Ingestor(Deployment(settings, BENCH_POLICIES), store)
    try:
        if not ingestor.acquire(30):
            raise BenchError("the ingest lock of the benchmark database is held by someone else")
        assigned_s = time.perf_counter() - began
        stored = 0
        deadline = time.monotonic() + 120
        # Setup, not timed: lock, assignment, committed offsets and the first fetches, until the
        # warm-up records are stored. Then the measured records are produced, before the clock starts.
        while stored < sizes.ingest_warmup:
            stored += ingestor.ingest_batch(0.5).stored
            if time.monotonic() > deadline:
                raise BenchError(f"ingest: only {stored} of {sizes.ingest_warmup} warm-up rows in 120 s")
        setup_s = time.perf_counter() - began
        produce_s = produce_records(
            bootstrap,
            settings.retry_topic,
            sizes.ingest_records,
            destination,
            at_ms,
            first=sizes.ingest_warmup,
        )
        log.info(
            "ingest: %s records produced to %s in %.1f s",
            sizes.ingest_records,
            settings.retry_topic,
            produce_s,
        )
        with connect(settings.database_url) as conn:
            row = conn.execute(bq("bench_max_id")).fetchone()
        after_id = int(row[0]) if row else 0
        stored_before = loop_stored_before = ingestor.totals.stored
        loop_batches_before = ingestor.totals.batches
        run_began = time.perf_counter()
        first_stored: list[tuple[float, int, int]] = []

        def all_stored() -> bool:
            totals = ingestor.totals
            if not first_stored and totals.stored > stored_before:
                # The loop is up: its worker processes started and stored their first batch.
                first_stored.append((time.perf_counter(), totals.stored, totals.batches))
            return totals.stored >= total

        # The ingest task's own loop: worker processes sharing the partitions, each pipelined (the
        # next batch is built while this one is stored).
        with ProcessCpu() as cpu:
            ingestor.run(600, should_stop=all_stored, grace_s=0)
        run_ended = time.perf_counter()
        timed_began, stored_before, batches_before = timed_from(
            (run_began, loop_stored_before, loop_batches_before),
            first_stored[0] if first_stored else None,
            ingestor.totals.stored,
        )
        whole_run = timed_began == run_began
        loop_start_s = timed_began - run_began
        elapsed = run_ended - timed_began
        stored, batches = ingestor.totals.stored, ingestor.totals.batches - batches_before
        if stored < total:
            raise BenchError(f"ingest: only {stored} of {total} rows stored in 600 s")
    finally:
        ingestor.close()
        store.close()
    timed_rows = stored - stored_before
    counts_by_status = env.job_counts()
    if counts_by_status != {"pending": total}:
        raise BenchError(f"ingest stored {counts_by_status}, expected {total} pending jobs")
    rate = per_second(timed_rows, elapsed)
    copy = copy_baseline(settings.database_url, after_id, sizes.ingest_records)
    result.figures = {
        "ingest_msgs_per_s": rate,
        "ingest_vs_copy": ratio(rate, copy["rows_per_s"]) if copy["rows_per_s"] else None,
    }
    result.details = {
        "records": total,
        "timed_rows": timed_rows,
        "warmup_rows": sizes.ingest_warmup,
        "first_batch_rows": stored_before - sizes.ingest_warmup,
        "seconds": round(elapsed, 3),
        "rows_per_s": rate,
        "batches": batches,
        "ingest_batch": settings.ingest_batch,
        "partitions": PARTITIONS,
        "record_bytes": len(retry_record(0, destination, 0)[1]),
        "produce_s": round(produce_s, 3),
        "setup_s": round(setup_s, 3),
        "lock_and_assignment_s": round(assigned_s, 3),
        "loop_start_s": round(loop_start_s, 3),
        "loop_start_timed": whole_run,
        "ingest_workers": settings.ingest_workers,
        "baseline": copy,
        # The loop's CPU (this process and its workers, their start included) per record it stored.
        **part_cpu(
            cpu.seconds(), ingestor.totals.stored - loop_stored_before, ("benchmark", "ingest workers")
        ),
    }
    result.details["limits"] = _ingest_limits(result.details, timed_rows, copy)
    result.notes = [
        f"{timed_rows} records ({result.details['record_bytes']}-byte values, 10 headers) ingested from a "
        f"{PARTITIONS}-partition retry topic in {elapsed:.2f} s by the ingest task's loop: "
        f"{settings.ingest_workers} worker processes, each with its share of the partitions, its consumer "
        f"and its connection, each building the next batch while PostgreSQL stores the last one. The "
        f"records were produced beforehand, in {produce_s:.1f} s.",
        f"Setup excluded from the rate: {setup_s:.2f} s for the ingest lock, partition assignment, the "
        f"stored-offset lookup and {sizes.ingest_warmup} warm-up rows; then "
        + (
            "nothing more: the loop stored every record in the first batches it reported, so its start "
            "(spawning the worker processes, their imports and connections) is inside the timed run."
            if whole_run
            else f"{loop_start_s:.2f} s for the loop's start (spawning the worker processes, their imports "
            f"and connections) and its first batch ({stored_before - sizes.ingest_warmup} rows)."
        )
        + " The loop starts once per Airflow run (every minute, each run lasting 90 s).",
        f"Baseline: binary COPY of the very same {copy['rows']} rows into bench_copy (LIKE retry_jobs "
        f"INCLUDING ALL) in {copy['seconds']:.2f} s.",
    ]
    return result


def timed_from(
    loop_began: tuple[float, int, int], first_report: tuple[float, int, int] | None, stored_at_end: int
) -> tuple[float, int, int]:
    """Where the ingest rate's clock starts: ``(time, rows stored, batches)`` at that moment.

    From the loop's first report of stored rows, so that starting the worker processes is not counted
    against the steady rate; but from the loop's start when that first report already held every row
    (a small ``--quick`` run), or never came, since then nothing would be left to time.
    """
    if first_report is None or first_report[1] >= stored_at_end:
        return loop_began
    return first_report


def _ingest_limits(details: dict[str, Any], rows: int, copy: dict[str, Any]) -> list[str]:
    """Where the time per record goes (see bench/README.md for the profile)."""
    wall_us = 1e6 * details["seconds"] / rows
    copy_us = 1e6 / copy["rows_per_s"] if copy.get("rows_per_s") else float("nan")
    workers = details["ingest_workers"]
    return [
        f"Per record: {wall_us:.1f} us of wall time with {workers} worker processes; the raw COPY costs "
        f"{copy_us:.1f} us per row on one connection. In each worker the Python part (consuming, parsing "
        "the headers, the policy, building the row) runs while PostgreSQL stores the previous batch.",
        "What limits it: CPython's per-record work, on a machine whose two cores also run PostgreSQL and "
        "the broker. Profiled in a one-process copy of the loop: the thread that consumes and builds needs "
        "11-13 us of CPU per record (building the row about 7, with `retry_scheduler.core.headers.parse_headers` "
        "half of it; the message accessors about 3, `headers()` making a list of ten tuples; consuming "
        "1.3), the thread that stores 1.2 us. One worker process per core is the most that pays here "
        "(three were slower than two). Before this layout (one process, a staging table and `INSERT ... "
        "ON CONFLICT`, a `Job` object per record) the same benchmark gave 11 785 records/s "
        "(bench/README.md).",
        "The ratio depends on the hour: the raw COPY's speed changes with the machine far more than the "
        "loop's CPU-bound Python does. Four earlier full runs gave 0.42-0.49 with the COPY at "
        "89 000-155 000 rows/s; at 230 000-250 000 rows/s this code gives 0.37-0.40.",
    ]


# -- publish ------------------------------------------------------------------------------------------


@dataclass
class BenchOptions:
    out: Path
    quick: bool = False
    only: tuple[str, ...] = MEASUREMENTS
    sizes: Sizes = field(default_factory=Sizes)
    db_name: str = "retry_bench"
    bootstrap: str | None = None
    keep_db: bool = False
    #: One dev stack for the measurements under the scheduler (the tests' short runs; see
    #: ``bench.capacity.live_stack``); a full run gives each its own.
    share_stack: bool = False


def _measurers() -> dict[str, Callable[[BenchEnv, Sizes], Result]]:
    from bench.burst import measure_burst
    from bench.capacity import measure_capacity
    from bench.claim import measure_claim
    from bench.fairness import measure_fairness
    from bench.handover import measure_handover
    from bench.held import measure_held_snapshot
    from bench.ordered import measure_ordered
    from bench.publish import measure_publish
    from bench.slow import measure_lateness, measure_spark
    from bench.soak import measure_soak

    return {
        "ingest": measure_ingest,
        "publish": measure_publish,
        "claim": measure_claim,
        "spark": measure_spark,
        "lateness": measure_lateness,
        "capacity": measure_capacity,
        "held_snapshot": measure_held_snapshot,
        "burst": measure_burst,
        "soak": measure_soak,
        "ordered": measure_ordered,
        "fairness": measure_fairness,
        "handover": measure_handover,
    }


def run_bench(
    settings: Settings,
    options: BenchOptions,
    say: Callable[[str], None] = print,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run the selected measurements and write the report; returns report.json's content.

    ``progress(done, total)`` hears of each selected measurement finished (the command's bar)."""
    from bench import cpu as bench_cpu
    from bench import report as bench_report
    from bench.capacity import loop_vs_parts

    unknown = sorted(set(options.only) - set(MEASUREMENTS))
    if unknown:
        raise BenchError(
            f"unknown measurement(s) {', '.join(unknown)}; choose from {', '.join(MEASUREMENTS)}"
        )
    options.out.mkdir(parents=True, exist_ok=True)
    run_id = f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
    started = datetime.now(UTC).isoformat()
    results: list[Result] = []
    measurers = _measurers()
    selected = [name for name in MEASUREMENTS if name in options.only]
    if progress is not None:
        progress(0, len(selected))
    with BenchEnv(
        settings, options.db_name, options.bootstrap, options.keep_db, share_stack=options.share_stack
    ) as env:
        env.report_dir = options.out
        machine = machine_info(env.url, own_broker=env.owns_broker)
        run_cpu = bench_cpu.cpu_times()
        for name in MEASUREMENTS:
            if name not in options.only:
                results.append(Result(name, skipped="not selected with --only in this run"))
                continue
            say(f"bench: {name} ...")
            load_before, cpu_before = os.getloadavg()[0], bench_cpu.cpu_times()
            began = time.perf_counter()
            try:
                result = measurers[name](env, options.sizes)
            except Exception as exc:
                log.exception("bench: %s failed", name)
                result = Result(name, skipped=f"failed in this run: {type(exc).__name__}: {exc}")
            result.finished_at = datetime.now(UTC).isoformat()
            result.details.setdefault("wall_s", round(time.perf_counter() - began, 1))
            # Other work on the machine skews every figure: the 1-minute load average, before and after.
            result.details["load_avg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
            # ... and how the CPU went meanwhile: a virtual machine's cores may be stolen by its host.
            result.details["cpu"] = bench_cpu.cpu_shares(cpu_before, bench_cpu.cpu_times())
            results.append(result)
            say(
                f"bench: {name} done in {time.perf_counter() - began:.0f} s: {result.skipped or result.figures}"
            )
            if progress is not None:
                progress(selected.index(name) + 1, len(selected))
        machine["cpu_during_run"] = bench_cpu.cpu_shares(run_cpu, bench_cpu.cpu_times())
    loop_vs_parts({r.name: r for r in results})
    report = bench_report.build_report(
        results,
        machine=machine,
        run_id=run_id,
        started_at=started,
        quick=options.quick,
        sizes=options.sizes,
    )
    bench_report.write_report(report, results, options.out)
    say(bench_report.table(report))
    say(f"report: {options.out / 'report.md'} (and report.json, PNG plots)")
    return report


def main(settings: Settings, args: Any, say: Callable[[str], None] = print) -> int:
    """The ``retry-scheduler bench`` command; exit 1 when a measured figure misses its target."""
    sizes = Sizes.quick() if args.quick else Sizes()
    changes = {
        name: value
        for name, value in (
            ("ingest_records", args.ingest_records),
            ("publish_rows", args.publish_rows),
            ("pgqueuer_rows", args.publish_rows),
            ("naive_rows", args.naive_rows),
            ("claim_large", args.claim_rows),
            ("lateness_seconds", args.lateness_seconds),
            ("capacity_rates", getattr(args, "capacity_rates", None)),
            ("capacity_seconds", getattr(args, "capacity_seconds", None)),
            ("held_rate", getattr(args, "held_rate", None)),
            ("held_seconds", getattr(args, "held_seconds", None)),
            ("held_spark_rows", getattr(args, "held_spark_rows", None)),
            ("burst_records", getattr(args, "burst_records", None)),
            ("burst_send_rate", getattr(args, "burst_rate", None)),
            ("soak_rate", getattr(args, "soak_rate", None)),
            ("soak_seconds", getattr(args, "soak_seconds", None)),
        )
        if value is not None
    }
    if changes:
        from dataclasses import replace

        sizes = replace(sizes, **changes)
    only = tuple(x.strip() for x in args.only.split(",") if x.strip()) if args.only else MEASUREMENTS
    options = BenchOptions(
        out=Path(args.out),
        quick=args.quick,
        only=only,
        sizes=sizes,
        db_name=args.db_name,
        keep_db=args.keep_db,
    )
    from retry_scheduler.cli.progress import progress

    if getattr(args, "json", False):  # the report on stdout; what happens meanwhile on stderr
        say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    with progress("bench", unit="measurements") as report_progress:
        report = run_bench(settings, options, say, report_progress)
    if getattr(args, "json", False):
        print(json.dumps(report, default=str), flush=True)
    missed = [k for k, t in report["targets"].items() if t["pass"] is False]
    if missed and not args.quick:
        say(f"bench: missed target(s): {', '.join(missed)} (see the report for what limits them)")
        return 1
    return 0


__all__ = ["MEASUREMENTS", "BenchEnv", "BenchError", "BenchOptions", "Result", "Sizes", "main", "run_bench"]
