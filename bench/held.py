"""Held snapshot: the whole loop at a fixed rate while a long transaction holds back vacuum.

A transaction that keeps its snapshot open (a report, a ``pg_dump``, a Spark job reading over JDBC)
keeps every row version published since it began: no VACUUM may remove them, and no index scan may
mark their entries dead. Queues whose claim walks those entries collapse (backlog runaway, dead rows
growing without bound) at a few hundred jobs per second.

``held_snapshot_p99_s`` and ``held_snapshot_throughput_ratio``: on the dev stack (the real Airflow
scheduler), records are sent at ``held_rate`` for ``held_seconds`` with nothing else running (the
baseline), then again while a REPEATABLE READ transaction, opened at the window's start after
reading ``retry_jobs``, holds its snapshot to the end. Throughput is what was published per second
from the first record's due time to the last acknowledgement; the ratio is the held window's over the
baseline's. Every ``SAMPLE_EVERY_S`` the windows record ``retry_jobs``' dead and live rows, the table's
and the due index's size, and the age of the oldest snapshot (``table_timeline``).

``held_snapshot_spark_p99_s`` and ``held_snapshot_spark_throughput_ratio``: a third window at the same
rate, the snapshot held again for the whole of it, while ``include/spark/bulk_retry.py`` re-publishes
``held_spark_rows`` dead jobs (stored before the window, to a destination of their own) through Spark
in local mode against the same database, as ``retry-scheduler bulk-retry`` runs it: its executors read the selection over JDBC and its workers mark
what the broker acknowledged, each in transactions of their own. The p99 and the throughput are of the
window's records due while the job ran (its JVM's start to its exit); the window's whole p99 is in
the details.

``held_snapshot_overdue_p99_s``: through every window, ``OVERDUE_RATE`` records a second are sent
with a ``retry.at`` a minute in the past (ingest fell behind, or a producer's clock), to a destination
of their own; the figure is the p99 of stored (the ingest transaction's start) -> acknowledged of
those of the held window (target: 1 s; each window's figures are in its ``overdue``). A publisher
that only looked below its last claim's floor on its periodic sweep would leave them a minute.

The bounds the table is judged against (each window's ``bounds``): while a snapshot is held nothing
written since may be vacuumed, so ``retry_jobs`` may gain up to :data:`VERSIONS_PER_JOB` dead row
versions for each job that went through the window (a record stored, claimed and moved out; a dead
job re-published by the bulk retry), and no more; its size may grow by up to :data:`MAX_ROW_BYTES` a
version. A table past them is leaking versions (a claim rewriting rows it does not take, a retry
loop): the window says so.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.capacity import _step, live_stack
from bench.env import BenchEnv, Result
from bench.sizes import Sizes
from bench.slow import steady_producer
from bench.timeline import MAX_P99_S, lateness_between, seconds

log = logging.getLogger(__name__)

SAMPLE_EVERY_S = 5.0
#: Statements running longer than this (and lock waits) are sampled every second through each window.
SLOW_STATEMENT_S = 1.0
#: At most this many such samples are kept in a window's details.
MAX_SLOW_SAMPLES = 300
#: Throughput with the snapshot held must be at least this share of the baseline's.
MIN_RATIO = 0.9
#: Records a second sent already overdue beside each window's traffic, and how overdue.
OVERDUE_RATE = 10
OVERDUE_BY_MS = 60_000
#: Dead row versions a job may leave in retry_jobs while a snapshot holds back vacuum: its insert
#: claimed (an update) and moved out (a delete), or a dead job marked by the bulk retry (an update).
VERSIONS_PER_JOB = 2
#: Bytes of table a row version may take, at most (a retry record's row is about 0.5 KiB, headers included).
MAX_ROW_BYTES = 1024


@contextlib.contextmanager
def periodic_samples(
    read: Callable[[], Any], every_s: float, what: str, *, final: bool = False
) -> Iterator[list[list[Any]]]:
    """Call ``read`` every ``every_s`` on a thread of its own while the block runs, from its start;
    yields the samples, [seconds from the start, what ``read`` returned] (lists are spread into the
    row), and takes one more at the end when ``final``. A sample that fails is a gap, logged as
    ``what``, not a failed measurement."""
    samples: list[list[Any]] = []
    stop = threading.Event()
    began = time.monotonic()

    def take() -> None:
        value = read()
        at = round(time.monotonic() - began, 1)
        samples.append([at, *value] if isinstance(value, list) else [at, value])

    def sample() -> None:
        while True:
            try:
                take()
            except Exception as exc:
                log.warning("%s sample failed: %s", what, exc)
            if stop.wait(every_s):
                return

    thread = threading.Thread(target=sample, name=f"bench-{what.replace(' ', '-')}-sampler", daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()
        if final:
            take()


def _table_state(env: BenchEnv) -> list[Any]:
    dead, live, table_b, index_b, xmin_age = env.sql("bench_table_state", {}, fetch=True)[0]
    return [int(dead), int(live), round(table_b / 2**20, 2), round(index_b / 2**20, 2), int(xmin_age or 0)]


def _slow_statements(env: BenchEnv) -> list[Any]:
    return [list(row) for row in env.sql("bench_slow_statements", {"over_s": SLOW_STATEMENT_S}, fetch=True)]


def table_sampler(env: BenchEnv) -> contextlib.AbstractContextManager[list[list[Any]]]:
    """Sample ``retry_jobs``' state every :data:`SAMPLE_EVERY_S` while the block runs: rows of
    [seconds from the start, dead rows, live rows, table MB, due index MB, oldest snapshot's age in
    transactions]."""
    return periodic_samples(lambda: _table_state(env), SAMPLE_EVERY_S, "retry_jobs table")


@contextlib.contextmanager
def held_snapshot(env: BenchEnv) -> Iterator[None]:
    """A REPEATABLE READ transaction that has read ``retry_jobs`` and holds its snapshot while the
    block runs (as a long report, a dump or a JDBC read would), rolled back after it."""
    import psycopg

    with psycopg.connect(env.url) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        rows = conn.execute("SELECT count(*) FROM retry_jobs").fetchone()
        log.info("held snapshot: a REPEATABLE READ transaction read %s rows of retry_jobs; held open", rows)
        try:
            yield
        finally:
            conn.rollback()


def _throughput(env: BenchEnv, destination: str, since: float = 0.0, until: float = 1e10) -> float | None:
    """A destination's published jobs due from ``since`` to ``until`` (epoch s; by default all) per
    second from the first one's due time to the last acknowledgement."""
    count, span = env.sql(
        "bench_published_due_between",
        {"destination": destination, "since": since, "until": until},
        fetch=True,
    )[0]
    return round(int(count) / float(span), 1) if span else None


def _seed_dead(env: BenchEnv, rows: int) -> str:
    """``rows`` dead jobs of a destination of their own for the bulk retry (vacuumed and analysed, as
    a table that grew slowly is); that destination."""
    destination = f"bench.held-spark-{env.tag}"
    env.create_topics([destination])
    began = time.monotonic()
    env.sql("bench_fill_dead", {"count": rows, "destination": destination, "source": "bench.held-spark"})
    env.sql("bench_vacuum_analyze")
    log.info(
        "held snapshot: %s dead jobs stored for the bulk retry in %.1f s", rows, time.monotonic() - began
    )
    return destination


@contextlib.contextmanager
def spark_bulk_retry(env: BenchEnv, settings: Any, destination: str, rows: int) -> Iterator[dict[str, Any]]:
    """Run the bulk retry of ``destination``'s dead jobs through Spark on a thread of its own while
    the block runs (waiting for it at the end); yields what it did: when it started and ended (epoch
    s), its exit code and its JSON result, and the destination's jobs by status after it."""
    from retry_scheduler.spark.submit import BULK_RETRY_APP, bulk_retry_args, run_spark_submit

    job: dict[str, Any] = {"destination": destination, "rows": rows, "result": {}}

    def run() -> None:
        job["started_at"] = time.time()
        try:
            args = bulk_retry_args({"destination": destination, "status": "dead", "dry_run": False})
            job["code"] = run_spark_submit(
                BULK_RETRY_APP, args, settings, show=lambda outcome: job.update(result=outcome)
            )
        except Exception as exc:  # reported with the window, not lost on the thread
            log.exception("held snapshot: the Spark bulk retry failed")
            job["error"] = f"{type(exc).__name__}: {exc}"
        job["ended_at"] = time.time()

    thread = threading.Thread(target=run, name="bench-held-spark", daemon=True)
    thread.start()
    try:
        yield job
    finally:
        thread.join()
        job["seconds"] = round(job["ended_at"] - job["started_at"], 1)
        job["by_status"] = env.job_counts(destination)
        job["rows_per_s"] = round(job["by_status"].get("published", 0) / max(0.001, job["seconds"]), 1)


@contextlib.contextmanager
def overdue_records(env: BenchEnv, settings: Any, window: str) -> Iterator[dict[str, Any]]:
    """Send :data:`OVERDUE_RATE` records a second, each due :data:`OVERDUE_BY_MS` before it is sent,
    while the block runs; then wait for them (a minute at most) and yield into the dict how many
    were sent and their stored -> acknowledged figures."""
    destination = f"bench.overdue-{env.tag}-{window}"
    env.create_topics([destination])
    stop = threading.Event()
    sent: list[int] = []
    thread = threading.Thread(
        target=lambda: sent.append(
            steady_producer(
                settings.bootstrap_servers, settings.retry_topic, destination, OVERDUE_RATE, float("inf"),
                -OVERDUE_BY_MS, f"overdue-{window}", stop,
            )
        ),
        name="bench-held-overdue",
    )  # fmt: skip
    figures: dict[str, Any] = {"destination": destination, "overdue_by_s": OVERDUE_BY_MS / 1000}
    thread.start()
    try:
        yield figures
    finally:
        stop.set()
        thread.join()
        deadline = time.monotonic() + 60
        while True:  # a few hundred rows: counted each half second until all are published
            [(count, p50, p99, worst, not_overdue)] = env.sql(
                "bench_stored_to_published", {"destination": destination}, fetch=True
            )
            if count >= (sent[0] if sent else 0) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        figures.update(
            sent=sent[0] if sent else 0, published=int(count), not_overdue=int(not_overdue),
            p50_s=seconds(p50), p99_s=seconds(p99), max_s=seconds(worst),
        )  # fmt: skip


def _keep_logs(env: BenchEnv, stack: Any, window: str) -> str | None:
    """Copy the stack's logs (its processes', the Airflow tasks', the broker's) to ``logs-<window>``
    beside the report, for a window that missed: the run's own folder is removed at its end."""
    if env.report_dir is None:
        return None
    to = env.report_dir / f"logs-{window}"
    shutil.rmtree(to, ignore_errors=True)
    for source, name in (
        (stack.log_dir, "stack"),
        (Path(stack.airflow_home) / "logs", "airflow"),
        (env.work_dir / "kafka.log", "kafka.log"),
    ):
        source = Path(source)
        if source.is_dir():
            shutil.copytree(source, to / name, dirs_exist_ok=True)
        elif source.is_file():
            to.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    log.info("held snapshot: the %s window missed; its logs are kept in %s", window, to)
    return str(to)


def _window(
    env: BenchEnv, stack: Any, rate: int, seconds: int, metadata_url: str, load: str, sizes: Sizes
) -> dict[str, Any]:
    """One window at ``rate`` with ``load`` beside it: nothing (``baseline``), a snapshot held open
    (``held``) or a Spark bulk retry (``spark``). Statements slower than :data:`SLOW_STATEMENT_S`
    are sampled each second (``slow_statements``: [seconds from the start, [application, state,
    wait, seconds, statement], ...]); a window that misses keeps its logs (``logs``)."""
    settings = stack.settings
    bulk_destination = _seed_dead(env, sizes.held_spark_rows) if load == "spark" else ""
    with contextlib.ExitStack() as blocks:
        # Outermost: the wait for its last records comes after the snapshot and the sampler end (a
        # sample taken after the snapshot's release would show it gone inside the window).
        overdue = blocks.enter_context(overdue_records(env, settings, load))
        samples = blocks.enter_context(table_sampler(env))
        slow = blocks.enter_context(periodic_samples(lambda: _slow_statements(env), 1.0, "slow statements"))
        if load in ("held", "spark"):
            blocks.enter_context(held_snapshot(env))
        job = None
        if load == "spark":
            job = blocks.enter_context(
                spark_bulk_retry(env, settings, bulk_destination, sizes.held_spark_rows)
            )
        step = _step(env, settings, rate, seconds, metadata_url, label=load)
    step["window"] = load
    step["table_timeline"] = samples
    step["slow_statements"] = [row for row in slow if len(row) > 1][:MAX_SLOW_SAMPLES]
    if step["p99_s"] is None or step["p99_s"] > MAX_P99_S:
        step["logs"] = _keep_logs(env, stack, load)
    step["overdue"] = overdue
    jobs = step["sent"] + overdue["sent"] + (sizes.held_spark_rows if load == "spark" else 0)
    step["bounds"] = _bounds(samples, jobs)
    step["published_per_s"] = _throughput(env, step["destination"])
    if job is not None:
        step["spark"] = job
        # Seconds from the window's start, for the plot.
        job["from_s"] = round(job["started_at"] - step["began_at"], 1)
        job["to_s"] = round(job["ended_at"] - step["began_at"], 1)
        published = job["by_status"].get("published", 0)
        if job.get("error") or job.get("code") != 0 or published != sizes.held_spark_rows:
            # The other windows' figures stand; this one's say why they are missing.
            job["failed"] = (
                f"failed: the Spark bulk retry beside the loop published {published:,} of its "
                f"{sizes.held_spark_rows:,} jobs (exit {job.get('code')}, {job.get('error') or job['result']})"
            )
            log.error("held snapshot: %s", job["failed"])
            return step
        during = lateness_between(env, step["destination"], job["started_at"], job["ended_at"])
        during["published_per_s"] = _throughput(env, step["destination"], job["started_at"], job["ended_at"])
        job["during"] = during
    return step


def _bounds(samples: list[list[Any]], jobs: int) -> dict[str, Any]:
    """The most dead rows and table MB a window may reach with ``jobs`` going through it (from what
    the table held at its first sample), what it reached, and whether that is within them."""
    if not samples:
        return {"within": None}
    first = samples[0]
    dead_bound = first[1] + VERSIONS_PER_JOB * jobs
    mb_bound = round(first[3] + VERSIONS_PER_JOB * jobs * MAX_ROW_BYTES / 2**20, 2)
    dead, mb = max(row[1] for row in samples), max(row[3] for row in samples)
    return {
        "jobs": jobs, "dead_rows": dead, "dead_rows_bound": dead_bound, "table_mb": mb,
        "table_mb_bound": mb_bound, "within": dead <= dead_bound and mb <= mb_bound,
    }  # fmt: skip


def _why_no_spark(sizes: Sizes) -> str:
    """Why the Spark window cannot run here ('' when it can)."""
    from retry_scheduler.spark.jdbc import jdbc_jars, spark_packages

    jars = jdbc_jars()
    if sizes.held_spark_rows <= 0:
        return "not measured: held_spark_rows is 0"
    if shutil.which("java") is None:
        return "not measured: no Java on PATH (make spark-deps)"
    if not spark_packages() and not (jars and all(Path(jar).is_file() for jar in jars.split(","))):
        return f"not measured: the PostgreSQL JDBC driver is not at {jars} (make spark-deps, or RETRY_SPARK_JARS)"
    return ""


def measure_held_snapshot(env: BenchEnv, sizes: Sizes) -> Result:
    """Lateness and throughput at ``sizes.held_rate`` alone, with a snapshot held open, and beside a
    Spark bulk retry of ``sizes.held_spark_rows`` dead jobs."""
    result = Result("held_snapshot")
    autovacuum = env.sql("bench_autovacuum", {}, fetch=True)[0][0] == "on"
    rate, seconds = sizes.held_rate, sizes.held_seconds
    why_no_spark = _why_no_spark(sizes)
    loads = ("baseline", "held") if why_no_spark else ("baseline", "held", "spark")
    with live_stack(env, "held") as stack:
        metadata_url = stack.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        windows = [_window(env, stack, rate, seconds, metadata_url, load, sizes) for load in loads]
    baseline, held = windows[0], windows[1]

    def ratio(published_per_s: float | None) -> float | None:
        base = baseline["published_per_s"]
        return round(published_per_s / base, 3) if published_per_s and base else None

    result.figures = {
        "held_snapshot_p99_s": held["p99_s"],
        "held_snapshot_throughput_ratio": ratio(held["published_per_s"]),
        "held_snapshot_overdue_p99_s": held["overdue"]["p99_s"],
    }
    result.details = {
        "rate_per_s": rate, "seconds": seconds, "autovacuum": autovacuum, "windows": windows,
        "max_p99_s": MAX_P99_S, "min_ratio": MIN_RATIO, "versions_per_job": VERSIONS_PER_JOB,
        "max_row_bytes": MAX_ROW_BYTES,
    }  # fmt: skip
    if why_no_spark:
        for key in ("held_snapshot_spark_p99_s", "held_snapshot_spark_throughput_ratio"):
            result.details[f"why_{key}"] = why_no_spark
    elif windows[2]["spark"].get("failed"):
        for key in ("held_snapshot_spark_p99_s", "held_snapshot_spark_throughput_ratio"):
            result.details[f"why_{key}"] = windows[2]["spark"]["failed"]
    else:
        during = windows[2]["spark"]["during"]
        result.figures["held_snapshot_spark_p99_s"] = during["p99_s"]
        result.figures["held_snapshot_spark_throughput_ratio"] = ratio(during["published_per_s"])

    def most(step: dict, column: int) -> Any:
        return max((row[column] for row in step["table_timeline"]), default=None)

    def spark_text(w: dict) -> str:
        job = w.get("spark")
        if not job:
            return ""
        if job.get("failed"):
            return f" {job['failed']}."
        during = job["during"]
        return (
            f" The bulk retry published its {job['by_status'].get('published', 0):,} dead jobs in {job['seconds']} s "
            f"({job['rows_per_s']:,.0f}/s, from +{job['from_s']} s to +{job['to_s']} s of the window, Spark's start "
            f"included); the window's {during['published']:,} records due meanwhile: p99 {during['p99_s']} s, "
            f"max {during['max_s']} s, {during['early']} early, {during['published_per_s']} published/s."
        )

    def overdue_text(o: dict[str, Any]) -> str:
        return (
            f"Records sent {o['overdue_by_s']:g} s overdue: {o['published']:,} of {o['sent']:,} published, "
            f"stored -> acknowledged p50 {o['p50_s']} s, p99 {o['p99_s']} s, max {o['max_s']} s."
        )

    def bounds_text(b: dict[str, Any]) -> str:
        if b.get("within") is None:
            return "no table samples"
        return (
            f"{'within' if b['within'] else 'PAST'} its bounds for {b['jobs']:,} jobs "
            f"({b['dead_rows_bound']:,} dead rows, {b['table_mb_bound']} MB)"
        )

    label = {"baseline": "alone", "held": "snapshot held", "spark": "snapshot held and a Spark bulk retry"}
    result.notes = [
        f"{rate:,} records/s for {seconds} s under the Airflow scheduler, first alone, then while a REPEATABLE "
        "READ transaction that had read retry_jobs held its snapshot open for the whole window"
        + (
            ""
            if why_no_spark
            else f", then with the snapshot held again beside a Spark bulk retry of "
            f"{sizes.held_spark_rows:,} dead jobs"
        )
        + f" (autovacuum {'on' if autovacuum else 'off'}).",
        *[
            f"{label[w['window']]}: {w['published']:,} of {w['sent']:,} published, {w['early']} early, "
            f"p50 {w['p50_s']} s, p99 {w['p99_s']} s, max {w['max_s']} s, {w['published_per_s']} published/s; "
            f"retry_jobs at most {most(w, 1):,} dead rows, {most(w, 3)} MB (due index {most(w, 4)} MB), oldest "
            f"snapshot {most(w, 5):,} transactions old; {bounds_text(w['bounds'])}. {overdue_text(w['overdue'])}"
            + spark_text(w)
            + (f" It missed: its logs are kept in {w['logs']}." if w.get("logs") else "")
            for w in windows
            if w["table_timeline"]
        ],
    ]
    return result
