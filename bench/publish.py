"""The publish measurement: due jobs claimed, produced, acknowledged and marked by the service's
publishers, against PgQueuer and a naive poller on the same rows."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

from bench.cpu import ProcessCpu, part_cpu
from bench.env import PARTITIONS, BenchEnv, BenchError, Result, TimedStore, insert_due_jobs, per_second, ratio
from bench.sizes import Sizes
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.db.store import Store
from retry_scheduler.loops.publish import Publisher

log = logging.getLogger(__name__)


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
    publisher = Publisher(
        Deployment.load(settings), timed_store(settings.database_url), store_factory=timed_store
    )
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
        for name, seconds in store.queue.seconds.items():
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
