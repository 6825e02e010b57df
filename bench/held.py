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
baseline's. Every ``SAMPLE_EVERY_S`` both windows record ``retry_jobs``' dead and live rows, the table's
and the due index's size, and the age of the oldest snapshot (``table_timeline``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench.capacity import MAX_P99_S, _step, live_stack
from bench.env import BenchEnv, Result, Sizes

log = logging.getLogger(__name__)

SAMPLE_EVERY_S = 5.0
#: Throughput with the snapshot held must be at least this share of the baseline's.
MIN_RATIO = 0.9


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


def _throughput(env: BenchEnv, destination: str) -> float | None:
    count, span = env.sql("bench_published_since_due", {"destination": destination}, fetch=True)[0]
    return round(int(count) / float(span), 1) if span else None


def _window(env: BenchEnv, settings: Any, rate: int, seconds: int, metadata_url: str, held: bool) -> dict:
    label = "held" if held else "baseline"
    with contextlib.ExitStack() as blocks:
        samples = blocks.enter_context(table_sampler(env))
        if held:
            blocks.enter_context(held_snapshot(env))
        step = _step(env, settings, rate, seconds, metadata_url, label=label)
    step["window"] = label
    step["table_timeline"] = samples
    step["published_per_s"] = _throughput(env, step["destination"])
    return step


def measure_held_snapshot(env: BenchEnv, sizes: Sizes) -> Result:
    """Lateness and throughput at ``sizes.held_rate`` without and with a snapshot held open."""
    result = Result("held_snapshot")
    autovacuum = env.sql("bench_autovacuum", {}, fetch=True)[0][0] == "on"
    rate, seconds = sizes.held_rate, sizes.held_seconds
    with live_stack(env, "held", sizes) as stack:
        settings = stack.settings
        metadata_url = stack.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        baseline = _window(env, settings, rate, seconds, metadata_url, held=False)
        held = _window(env, settings, rate, seconds, metadata_url, held=True)
    ratio = (
        round(held["published_per_s"] / baseline["published_per_s"], 3)
        if held["published_per_s"] and baseline["published_per_s"]
        else None
    )
    result.figures = {"held_snapshot_p99_s": held["p99_s"], "held_snapshot_throughput_ratio": ratio}
    result.details = {
        "rate_per_s": rate, "seconds": seconds, "autovacuum": autovacuum, "windows": [baseline, held],
        "max_p99_s": MAX_P99_S, "min_ratio": MIN_RATIO,
    }  # fmt: skip

    def most(step: dict, column: int) -> Any:
        return max((row[column] for row in step["table_timeline"]), default=None)

    result.notes = [
        f"{rate:,} records/s for {seconds} s under the Airflow scheduler, first alone, then while a REPEATABLE "
        "READ transaction that had read retry_jobs held its snapshot open for the whole window "
        f"(autovacuum {'on' if autovacuum else 'off'}).",
        *[
            f"{w['window']}: {w['published']:,} of {w['sent']:,} published, {w['early']} early, p50 {w['p50_s']} s, "
            f"p99 {w['p99_s']} s, max {w['max_s']} s, {w['published_per_s']} published/s; retry_jobs at most "
            f"{most(w, 1):,} dead rows, {most(w, 3)} MB (due index {most(w, 4)} MB), oldest snapshot "
            f"{most(w, 5):,} transactions old."
            for w in (baseline, held)
            if w["table_timeline"]
        ],
    ]
    return result
