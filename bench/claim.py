"""The claim measurement: the publish loop's claim statement on a table of 10 million rows against one
of 10 000, with the same due backlog: its cost must follow the backlog, not the table."""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any

import psycopg

from bench.env import BenchEnv, BenchError, Result
from bench.queries import bq
from bench.sizes import Sizes
from retry_scheduler.db.connection import connect
from retry_scheduler.db.store import Store

log = logging.getLogger(__name__)


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
                        rows = store.queue.claim_due(sizes.claim_limit)
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
        f"Queue.claim_due({sizes.claim_limit}): median of {sizes.claim_repeats} claims each (after one "
        f"warm-up; each in a transaction rolled back after it; small and large alternating): "
        f"{runs['small']['claim_median_ms']:.2f} ms with {runs['small']['rows']:,} rows vs "
        f"{runs['large']['claim_median_ms']:.2f} ms with {runs['large']['rows']:,} rows "
        f"({runs['large']['bytes'] / 2**30:.1f} GiB with indexes, built in {runs['large']['build_s']:.0f} s); "
        f"both hold the same backlog of {sizes.claim_due} due jobs, the rest is published and dead history "
        "and jobs due later.",
    ]
    return result


# -- the run ------------------------------------------------------------------------------------------
