"""The baselines of ``retry-scheduler bench``, each run in the same run and on the same server as its figure.

* ingest: a binary ``COPY`` of the very rows the ingest loop stored into ``bench_copy``, a table of
  the same shape and indexes (``LIKE retry_jobs INCLUDING ALL``);
* publish: PgQueuer (from PyPI) dequeuing and acknowledging as many scheduled jobs, with the
  settings of its own drain benchmark; and the row-by-row poller that teams describe when they
  build their own retry service: select due rows, publish each and wait for it, update each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from importlib import metadata
from typing import TYPE_CHECKING, Any, cast

from confluent_kafka import KafkaError, Message, Producer

from bench.queries import bench_queries, bq
from retry_scheduler.core.jobs import OutgoingRow, destination_headers
from retry_scheduler.db.connection import connect
from retry_scheduler.db.schema import queries
from retry_scheduler.loops.kafka import producer_config

MARK = queries()["mark_published"]

if TYPE_CHECKING:
    from bench.env import BenchEnv
    from retry_scheduler.core.config import Settings

log = logging.getLogger(__name__)


def copy_baseline(url: str, after_id: int, expected: int) -> dict[str, Any]:
    """Time a binary COPY of the rows stored after ``after_id`` into ``bench_copy`` (committed).

    The rows are exported as one binary COPY stream before the clock starts, so the timed part is
    PostgreSQL's own work (parse, heap, indexes, commit) with nothing computed on the client.
    """
    with connect(url) as conn:
        conn.execute(bq("bench_drop_copy_table"))
        conn.execute(bq("bench_create_copy_table"))
        conn.commit()
        stream = bytearray()
        with conn.cursor() as cur, cur.copy(bq("bench_export_rows"), {"after_id": after_id}) as copy:
            for chunk in copy:
                stream += chunk
        conn.commit()
        began = time.perf_counter()
        with conn.cursor() as cur, cur.copy(bq("bench_copy_rows")) as copy:
            view = memoryview(stream)
            for start in range(0, len(view), 1 << 20):
                copy.write(view[start : start + (1 << 20)])
        conn.commit()
        took = time.perf_counter() - began
        row = conn.execute(bq("bench_copy_count")).fetchone()
        copied = int(row[0]) if row else 0
        conn.execute(bq("bench_drop_copy_table"))
        conn.commit()
    if copied != expected:
        raise RuntimeError(f"COPY baseline stored {copied} rows, expected {expected}")
    return {
        "what": "binary COPY of the same rows into bench_copy (LIKE retry_jobs INCLUDING ALL)",
        "rows": copied,
        "bytes": len(stream),
        "seconds": round(took, 3),
        "rows_per_s": round(copied / took, 1) if took > 0 else 0.0,
    }


# -- the naive poller -------------------------------------------------------------------------------


def naive_poller(env: BenchEnv, settings: Settings, rows: int, destination: str) -> dict[str, Any]:
    """Publish ``rows`` due jobs the hand-made way: SELECT 100 due rows, then per row produce, wait
    for the broker's acknowledgement (flush), UPDATE the row and commit."""
    from bench.env import insert_due_jobs

    load_s = insert_due_jobs(env.url, rows, "bench.naive", destination)
    env.sql("bench_analyze")
    producer = Producer(producer_config(settings))
    producer.list_topics(destination, timeout=10)
    errors: list[str] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err.str())

    done = selects = 0
    with connect(env.url) as conn:
        began = time.perf_counter()
        while True:
            page = conn.execute(bq("bench_naive_select"), {"limit": 100}).fetchall()
            conn.commit()
            selects += 1
            if not page:
                break
            for raw in page:
                row = OutgoingRow(*raw)
                kwargs: dict[str, Any] = {"key": row.key, "value": row.value, "on_delivery": delivered}
                if row.destination_partition is not None:
                    kwargs["partition"] = row.destination_partition
                producer.produce(
                    row.destination or destination, headers=cast(Any, destination_headers(row)), **kwargs
                )
                if producer.flush(30) or errors:
                    raise RuntimeError(f"naive poller: delivery failed: {errors[:1] or 'no ack in 30 s'}")
                # marked as the service marks (moved to retry_published_jobs), one job at a time
                conn.execute(MARK, {"ids": [row.id], "acked_ms": [int(time.time() * 1000)]})
                conn.commit()
                done += 1
        took = time.perf_counter() - began
    if done != rows:
        raise RuntimeError(f"naive poller published {done} rows, expected {rows}")
    rate = round(done / took, 1) if took > 0 else 0.0
    return {
        "what": "row-by-row poller: SELECT 100 due rows; per row produce, flush, UPDATE, COMMIT",
        "rows": done,
        "selects": selects,
        "seconds": round(took, 3),
        "rows_per_s": rate,
        "load_s": round(load_s, 3),
        "note": f"Naive poller: {done} due jobs (fewer than ours: it is slow; the rate is per second either "
        f"way) selected 100 at a time, each produced with the same producer settings, awaited, updated and "
        f"committed: {rate:,.0f} rows/s.",
    }


# -- PgQueuer ---------------------------------------------------------------------------------------


def pgqueuer_version() -> str | None:
    try:
        return metadata.version("pgqueuer")
    except metadata.PackageNotFoundError:
        return None


def pgqueuer_baseline(
    url: str, rows: int, batch_sizes: tuple[int, ...], consumers: int = 5
) -> dict[str, Any]:
    """PgQueuer dequeuing and acknowledging ``rows`` jobs scheduled in the past, with each of ``batch_sizes``.

    Like PgQueuer's own drain benchmark (tools/benchmark.py): ``consumers`` queue managers, each on
    its own asyncpg connection in one event loop, a no-op async entrypoint, ``mode=drain``. The
    clock runs from the first job handed to an entrypoint (PgQueuer's start-up is left out) until
    every manager has returned, which is after its acknowledgements were flushed.
    """
    version = pgqueuer_version()
    if version is None:
        return {
            "rows_per_s": None,
            "note": "PgQueuer baseline not measured in this run: pgqueuer is not installed "
            "(pip install -e '.[bench]').",
        }
    try:
        import uvloop

        run: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop comes with pgqueuer on Linux
        run = asyncio.run
    runs = [run(_pgqueuer_drain(url, rows, size, consumers)) for size in batch_sizes]
    # The figure is against PgQueuer as recommended (its default batch size, that of its own benchmark,
    # the first tried); the best of the larger batches tried is reported next to it.
    recommended = runs[0]
    best = max(runs, key=lambda r: r["rows_per_s"])
    tried = ", ".join(f"batch {r['batch_size']}: {r['rows_per_s']:,.0f}/s" for r in runs)
    return {
        "what": f"PgQueuer {version}: {consumers} queue managers (asyncpg), drain mode, no-op entrypoint",
        "version": version,
        "rows": rows,
        "consumers": consumers,
        "batch_size": recommended["batch_size"],
        "seconds": recommended["seconds"],
        "rows_per_s": recommended["rows_per_s"],
        "best_tuned": {"batch_size": best["batch_size"], "rows_per_s": best["rows_per_s"]},
        "runs": runs,
        "note": f"PgQueuer {version}: {rows} jobs enqueued with execute_after in the past, then dequeued and "
        f"acknowledged by {consumers} queue managers in drain mode, as in its own drain benchmark; with its "
        f"default batch size {recommended['batch_size']} (the figure's baseline) and larger ones: {tried}.",
    }


async def _pgqueuer_drain(url: str, rows: int, batch_size: int, consumers: int) -> dict[str, Any]:
    import asyncpg
    from pgqueuer import AsyncpgDriver, PgQueuer, Queries
    from pgqueuer.models import Job as PgqJob
    from pgqueuer.types import QueueExecutionMode

    admin = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(admin))
        if not await queries.schema_is_installed():
            await queries.install()
        await queries.clear_queue()
        await queries.clear_queue_log()
        await queries.clear_statistics_log()
        payload = b'{"order_id": "00000000", "amount": 129.90, "note": "' + b"x" * 200 + b'"}'
        began = time.perf_counter()
        for start in range(0, rows, 10_000):
            n = min(rows, start + 10_000) - start
            await queries.enqueue(["bench"] * n, [payload] * n, [0] * n, [timedelta(seconds=-1)] * n)
        enqueue_s = time.perf_counter() - began
        # Up-to-date statistics, as for our own table (see measure_publish).
        await admin.execute(bench_queries()["bench_analyze_pgqueuer"])

        handled = 0
        first: float | None = None
        connections = [await asyncpg.connect(url) for _ in range(consumers)]
        managers = [PgQueuer(AsyncpgDriver(c)) for c in connections]
        for pgq in managers:

            @pgq.entrypoint("bench")
            async def handle(job: PgqJob) -> None:
                nonlocal handled, first
                if first is None:
                    first = time.perf_counter()
                handled += 1

        began = time.perf_counter()
        await asyncio.gather(*(m.run(batch_size=batch_size, mode=QueueExecutionMode.drain) for m in managers))
        ended = time.perf_counter()
        for c in connections:
            await c.close()
        left = sum(s.count for s in await queries.queue_size())
        if handled != rows or left:
            raise RuntimeError(f"PgQueuer handled {handled} of {rows} jobs, {left} left in its queue")
        took = ended - (first or began)
        return {
            "batch_size": batch_size,
            "enqueue_s": round(enqueue_s, 3),
            "startup_s": round((first or began) - began, 3),
            "seconds": round(took, 3),
            "rows_per_s": round(rows / took, 1) if took > 0 else 0.0,
        }
    finally:
        await admin.close()
