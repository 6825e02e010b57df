"""Fair publishing (issue 33): one destination's flood of due jobs must not delay another's few.

Two runs of the publish task's own loop (its publishers side by side, as in ``bench.publish``), each
against the real PostgreSQL and broker:

1. **Beside a flood**: ``fairness_flood`` jobs of one destination, all due when the run starts, and
   ``fairness_small`` jobs of another, falling due evenly over ``fairness_window_s`` seconds from
   ``fairness_first_due_s`` after the publisher starts (while the flood drains): the figure is of the
   flood's steady drain, not of a publisher's first rounds (beside a fresh million-job backlog those
   took about 1.4 s here: its producers connecting, its first claims). ``fairness_small_p99_s``: the p99 lateness (acknowledged minus
   due) of the small destination's jobs. The figure counts only if the flood was still draining when
   the last small job fell due (``flood_left_when_small_done`` > 0); otherwise it is left out, with why.
2. **Alone** (the baseline, ``fairness_small_alone_p99_s``): the same small stream with nothing else due.

Both streams are stored with the service's own insert (which records their destinations, as the
ingest does), before the publisher starts.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from bench.env import BenchEnv, Result, due_job, insert_due_jobs, per_second
from bench.jobs import insert_jobs
from bench.sizes import Sizes
from bench.timeline import lateness_between
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.db.store import Store
from retry_scheduler.loops.publish import Publisher

log = logging.getLogger(__name__)


def _insert_stream(url: str, count: int, destination: str, first_due_ms: int, window_s: float) -> None:
    """``count`` jobs of ``destination`` falling due evenly from ``first_due_ms`` over ``window_s``."""
    step_ms = 1000 * window_s / max(1, count - 1)
    with Store(url) as store:
        for start in range(0, count, 5000):
            insert_jobs(
                store,
                [
                    due_job(i, f"bench.fair-{destination}", destination, first_due_ms + int(i * step_ms))
                    for i in range(start, min(count, start + 5000))
                ],
            )


def _publish_all(env: BenchEnv, settings: Any, total: int, limit_s: float) -> tuple[float, int]:
    """The publish task's loop until ``total`` jobs are out; its seconds and the jobs published."""
    publisher = Publisher(Deployment.load(settings), Store(settings.database_url))
    try:
        began = time.perf_counter()
        counts = publisher.run(limit_s, should_stop=lambda: publisher.published_so_far() >= total, grace_s=0)
        return time.perf_counter() - began, counts.published
    finally:
        publisher.close()
        publisher.store.close()


def _lateness(env: BenchEnv, destination: str) -> dict[str, Any]:
    return lateness_between(env, destination, 0, 4e9)


def _stream_run(env: BenchEnv, sizes: Sizes, small: str, flood: str | None, settings: Any) -> dict[str, Any]:
    """One run: the small stream (and the flood, when named) stored, then published to the last job."""
    url = settings.database_url
    load_s = 0.0
    if flood is not None:
        load_s = insert_due_jobs(url, sizes.fairness_flood, "bench.fair-flood", flood)
        env.sql("bench_analyze")
    # The stream's due times start about when the publisher does, whatever the flood's load took.
    first_due_ms = int(1000 * (time.time() + sizes.fairness_first_due_s))
    _insert_stream(url, sizes.fairness_small, small, first_due_ms, sizes.fairness_window_s)
    total = sizes.fairness_small + (sizes.fairness_flood if flood is not None else 0)
    seconds, published = _publish_all(env, settings, total, limit_s=600 + sizes.fairness_window_s)
    run: dict[str, Any] = {
        "small": _lateness(env, small),
        "seconds": round(seconds, 3),
        "published": published,
        "load_s": round(load_s, 3),
    }
    if flood is not None:
        last_small_due_s = (first_due_ms / 1000) + sizes.fairness_window_s
        [(left,)] = env.sql(
            "bench_published_after", {"destination": flood, "after": last_small_due_s}, fetch=True
        )
        run["flood"] = _lateness(env, flood)
        run["flood_published_per_s"] = per_second(run["flood"]["published"], seconds)
        run["flood_left_when_small_done"] = int(left)
    return run


def measure_fairness(env: BenchEnv, sizes: Sizes) -> Result:
    """The small destination's p99 lateness beside a flood of another's, and alone."""
    result = Result("fairness")
    settings = env.settings("fairness")
    small, alone, flood = (f"bench.fair-{part}-{env.tag}" for part in ("small", "alone", "flood"))
    env.sql("bench_truncate")
    env.create_topics([small, alone, flood])
    beside = _stream_run(env, sizes, small, flood, settings)
    env.sql("bench_truncate")
    baseline = _stream_run(env, sizes, alone, None, settings)
    for name, run in (("beside the flood", beside), ("alone", baseline)):
        expected = sizes.fairness_small
        if run["small"]["published"] != expected or run["small"]["early"]:
            raise RuntimeError(
                f"fairness {name}: {run['small']['published']} of {expected} small jobs published, "
                f"{run['small']['early']} early"
            )
    valid = beside["flood_left_when_small_done"] > 0
    result.figures = {
        "fairness_small_p99_s": beside["small"]["p99_s"] if valid else None,
        "fairness_small_alone_p99_s": baseline["small"]["p99_s"],
    }
    if not valid:
        result.details["why_fairness_small_p99_s"] = (
            "the flood had drained before the last small job fell due: give a larger fairness_flood"
        )
    result.details.update(
        {
            "flood_jobs": sizes.fairness_flood,
            "small_jobs": sizes.fairness_small,
            "small_window_s": sizes.fairness_window_s,
            "publish_batch": settings.publish_batch,
            "publish_workers": settings.publish_workers,
            "beside_flood": beside,
            "alone": baseline,
        }
    )
    result.notes = [
        f"{sizes.fairness_flood:,} jobs of one destination due at once, and {sizes.fairness_small:,} of "
        f"another falling due evenly over {sizes.fairness_window_s} s while they drain "
        f"({beside['flood_published_per_s']:,.0f} flood jobs/s; {beside['flood_left_when_small_done']:,} "
        "flood jobs still waiting when the last small job fell due): the small destination's p99 "
        f"lateness {beside['small']['p99_s']} s (worst {beside['small']['max_s']} s), against "
        f"{baseline['small']['p99_s']} s (worst {baseline['small']['max_s']} s) for the same stream alone. "
        f"The flood's own worst lateness: {beside['flood']['max_s']} s. No job early.",
    ]
    return result
