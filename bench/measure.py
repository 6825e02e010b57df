"""``retry-scheduler bench``: measure the service against baselines run in the same process and run.

Every figure is measured on the real PostgreSQL (a throwaway database, ``retry_bench``, migrated
with :func:`retry_scheduler.db.store.migrate` and dropped at the end) and the embedded Kafka-protocol
broker (a Tansu started on a free port, memory storage), through the service's own code paths:
:class:`~retry_scheduler.loops.ingest.Ingestor` fed from a real retry topic, and
:class:`~retry_scheduler.loops.publish.Publisher` on due jobs stored with
:meth:`~retry_scheduler.db.store.Store.insert_jobs`. Each baseline runs right after its figure, on the
same server, with the same rows. The report (``report.json``, ``report.md``, PNG plots) is written
by :mod:`bench.report`; the baselines live in :mod:`bench.baselines`.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from bench.cpu import ProcessCpu, part_cpu
from bench.env import (
    BENCH_POLICIES,
    MEASUREMENTS,
    PARTITIONS,
    BenchEnv,
    BenchError,
    Result,
    Sizes,
    TimedStore,
    insert_due_jobs,
    per_second,
    produce_records,
    ratio,
    retry_record,
)
from bench.queries import bq
from retry_scheduler.core.config import Settings
from retry_scheduler.db.connection import connect
from retry_scheduler.db.store import Store
from retry_scheduler.loops.ingest import Ingestor
from retry_scheduler.loops.publish import Publisher

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
    ingestor = Ingestor(settings, BENCH_POLICIES, store)
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
    counts_by_status = dict(env.sql("bench_status_counts", fetch=True))
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


def measure_publish(env: BenchEnv, sizes: Sizes) -> Result:
    """Publish due jobs (claim, produce, ack, mark); baselines: PgQueuer and the naive poller."""
    from bench.baselines import naive_poller, pgqueuer_baseline

    result = Result("publish")
    settings = env.settings("publish")
    destination = f"bench.out-{env.tag}"
    env.sql("bench_truncate")
    env.create_topics([destination])
    load_s = insert_due_jobs(settings.database_url, sizes.publish_rows, "bench.publish", destination)
    # The statistics autovacuum gathers within a minute of a bulk insert: measure that steady state,
    # not the first minute, when the planner still believes the table empty (see the report).
    env.sql("bench_analyze")
    log.info("publish: %s due jobs stored in %.1f s", sizes.publish_rows, load_s)

    stores: list[TimedStore] = []

    def timed_store(url: str) -> Store:
        stores.append(TimedStore(url))
        return stores[-1]

    began = time.perf_counter()
    publisher = Publisher(settings, timed_store(settings.database_url), store_factory=timed_store)
    try:
        # Setup: the producer's connection and the destination's metadata.
        publisher.topics.ensure([destination], create=True)
        publisher.producer.list_topics(destination, timeout=10)
        setup_s = time.perf_counter() - began
        timed_began = time.perf_counter()
        # The publish task's own loop, with its helper publishers, until every job is out.
        with ProcessCpu() as cpu:
            counts = publisher.run(
                600, should_stop=lambda: publisher.published_so_far() >= sizes.publish_rows, grace_s=0
            )
        elapsed = time.perf_counter() - timed_began
        published = counts.published
        if counts.failed or published < sizes.publish_rows:
            raise BenchError(f"publish: {counts.failed} failed deliveries, {published} published")
    finally:
        publisher.close()
        for store in stores:
            store.close()
    db_seconds: defaultdict[str, float] = defaultdict(float)
    for store in stores:
        for name, seconds in store.seconds.items():
            db_seconds[name] += seconds
    on_topic = env.count_records(destination, sizes.publish_rows)
    if on_topic != sizes.publish_rows:
        raise BenchError(f"publish: {on_topic} records on {destination}, expected {sizes.publish_rows}")
    rate = per_second(published, elapsed)

    naive = naive_poller(env, settings, sizes.naive_rows, destination)
    pgq = pgqueuer_baseline(env.url, sizes.pgqueuer_rows, sizes.pgqueuer_batch_sizes)
    result.figures = {
        "publish_rows_per_s": rate,
        "publish_vs_pgqueuer": ratio(rate, pgq["rows_per_s"]) if pgq.get("rows_per_s") else None,
        "publish_vs_naive": ratio(rate, naive["rows_per_s"]) if naive["rows_per_s"] else None,
    }
    result.details = {
        "rows": published,
        "seconds": round(elapsed, 3),
        "rows_per_s": rate,
        "publish_batch": settings.publish_batch,
        "publish_workers": settings.publish_workers,
        "partitions": PARTITIONS,
        "records_on_topic": on_topic,
        "load_s": round(load_s, 3),
        "setup_s": round(setup_s, 3),
        "db_seconds": {k: round(v, 3) for k, v in sorted(db_seconds.items())},
        "baseline_pgqueuer": pgq,
        "vs_pgqueuer_best_tuned": (
            ratio(rate, pgq["best_tuned"]["rows_per_s"]) if pgq.get("best_tuned") else None
        ),
        "baseline_naive": naive,
        **part_cpu(cpu.seconds(), published, ("benchmark",)),
    }
    result.details["limits"] = _publish_limits(result.details, published)
    result.notes = [
        f"{published} due jobs claimed, produced (idempotent, acks=all), acknowledged and marked published "
        f"in {elapsed:.2f} s by the publish task's loop ({settings.publish_workers} publishers side by side, "
        f"batches of up to {settings.publish_batch}); all {on_topic} records "
        f"checked on the destination topic. Setup excluded: {setup_s:.2f} s (producer connection, metadata).",
        pgq["note"],
        naive["note"],
    ]
    if pgq.get("best_tuned"):
        best = pgq["best_tuned"]
        result.notes.append(
            f"Against PgQueuer at its fastest batch size here ({best['batch_size']}, "
            f"{best['rows_per_s']:,.0f} jobs/s) the ratio is {result.details['vs_pgqueuer_best_tuned']:.2f}x."
        )
    return result


def _publish_limits(details: dict[str, Any], rows: int) -> list[str]:
    db = details["db_seconds"]
    claim_us = 1e6 * (db.get("claim_due", 0) + db.get("claim_dead", 0)) / rows
    mark_us = 1e6 * db.get("mark_published", 0) / rows
    wall_us = 1e6 * details["seconds"] / rows
    workers = details["publish_workers"]
    return [
        f"Per job, added over the {workers} publishers: {claim_us:.1f} us claiming (one `SELECT ... FOR "
        f"UPDATE SKIP LOCKED`: row locks, nothing written) and {mark_us:.1f} us marking published (one "
        f"`UPDATE` from `unnest`, in the same transaction); {wall_us:.1f} us of wall time per job in all. "
        "The rest of each publisher's time is Python building the records' headers and producing them, "
        "and waiting for the broker's acknowledgements; while one publisher waits, the other works.",
        "What limits it: the one write per job that the guarantee rests on (`published` only after the "
        "acknowledgement): a new row version with its primary-key and source-key index entries, and WAL. "
        "Two cores are shared by PostgreSQL, the broker and the Python publishers.",
    ]


# -- claim cost ---------------------------------------------------------------------------------------


def build_claim_table(url: str, total: int, due: int) -> dict[str, Any]:
    """``retry_jobs`` at ``url`` with ``total`` rows: history from generate_series, then the due backlog.

    Vacuumed and analysed afterwards, as autovacuum leaves a table that grew slowly.
    """
    began = time.perf_counter()
    with connect(url, autocommit=True) as conn:
        conn.execute(bq("bench_truncate"))
        history = total - due
        step = 1_000_000
        for start in range(0, history, step):
            conn.execute(bq("bench_fill_history"), {"first": start + 1, "last": min(history, start + step)})
            log.info("claim: %s of %s history rows", min(history, start + step), history)
        conn.execute(bq("bench_fill_due"), {"count": due})
        conn.execute(bq("bench_vacuum_analyze"))
        row = conn.execute(bq("bench_table_size")).fetchone()
    assert row is not None
    return {"rows": int(row[0]), "bytes": int(row[1]), "build_s": round(time.perf_counter() - began, 1)}


def measure_claim(env: BenchEnv, sizes: Sizes) -> Result:
    """Claim 1 000 due jobs with a small and with a large table: the cost must follow the backlog.

    The small table lives in a second throwaway database, so that the claims can alternate between
    the two: a load that comes and goes on the machine then weighs on both alike.
    """
    result = Result("claim")
    with env.extra_database("small") as small_url:
        tables = {
            "small": build_claim_table(small_url, sizes.claim_small, sizes.claim_due),
            "large": build_claim_table(env.url, sizes.claim_large, sizes.claim_due),
        }
        times: dict[str, list[float]] = {"small": [], "large": []}
        with Store(small_url) as small, Store(env.url) as large:
            stores = {"small": small, "large": large}
            for i in range(sizes.claim_repeats + 1):
                for label, store in stores.items():
                    with store.conn.transaction():
                        began = time.perf_counter()
                        rows = store.claim_due(sizes.claim_limit)
                        took = time.perf_counter() - began
                        raise psycopg.Rollback()  # the claim only locks: ending its transaction frees them
                    if len(rows) != sizes.claim_limit:
                        raise BenchError(f"claim: {len(rows)} jobs claimed, expected {sizes.claim_limit}")
                    if i:  # the first claim of each warms the caches
                        times[label].append(took)
    runs = {
        label: {
            **tables[label],
            "claim_median_ms": round(statistics.median(times[label]) * 1000, 3),
            "claim_ms": [round(t * 1000, 3) for t in times[label]],
        }
        for label in ("small", "large")
    }
    ratio = runs["large"]["claim_median_ms"] / runs["small"]["claim_median_ms"]
    result.figures = {"claim_cost_ratio_10m_vs_10k": round(ratio, 3)}
    result.details = {
        "limit": sizes.claim_limit,
        "due_backlog": sizes.claim_due,
        "repeats": sizes.claim_repeats,
        "small": runs["small"],
        "large": runs["large"],
        "sizes_match_target": (sizes.claim_small, sizes.claim_large) == (10_000, 10_000_000),
    }
    result.notes = [
        f"Store.claim_due({sizes.claim_limit}): median of {sizes.claim_repeats} claims each (after one "
        f"warm-up; each in a transaction rolled back after it; small and large alternating): "
        f"{runs['small']['claim_median_ms']:.2f} ms with {runs['small']['rows']:,} rows vs "
        f"{runs['large']['claim_median_ms']:.2f} ms with {runs['large']['rows']:,} rows "
        f"({runs['large']['bytes'] / 2**30:.1f} GiB with indexes, built in {runs['large']['build_s']:.0f} s); "
        f"both hold the same backlog of {sizes.claim_due} due jobs, the rest is published and dead history "
        "and jobs due later.",
    ]
    return result


# -- the run ------------------------------------------------------------------------------------------


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
    from bench.held import measure_held_snapshot
    from bench.ordered import measure_ordered
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
        machine = bench_report.machine_info(env.url)
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
