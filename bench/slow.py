"""The slow measurements of ``retry-scheduler bench``: the PySpark jobs, and lateness under Airflow."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import statistics
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, cast

from bench.cpu import ProcessCpu, cpu_use_text
from bench.env import BenchError, Result
from bench.follower import DUE_HEADER
from bench.queries import bq
from bench.timeline import percentile
from retry_scheduler.core import protocol
from retry_scheduler.db.connection import connect
from retry_scheduler.dev.procs import free_port

if TYPE_CHECKING:
    from bench.env import BenchEnv
    from bench.sizes import Sizes
    from retry_scheduler.core.config import Settings

log = logging.getLogger(__name__)


# -- PySpark: bulk retry and compaction ---------------------------------------------------------------


def _spark(
    app: str, job_args: list[str], settings: Settings | None = None
) -> tuple[int, dict[str, Any], float]:
    """Run a job of include/spark the way ``retry-scheduler bulk-retry|compact`` does; exit code,
    the job's JSON result and the wall seconds (Spark's start-up included)."""
    from retry_scheduler.spark.submit import run_spark_submit

    out = io.StringIO()
    began = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = run_spark_submit(app, job_args, settings)
    took = time.perf_counter() - began
    lines = [line for line in out.getvalue().splitlines() if line.startswith("{")]
    return code, json.loads(lines[-1]) if lines else {}, took


def measure_spark(env: BenchEnv, sizes: Sizes) -> Result:
    """Bulk-retry ``spark_rows`` dead jobs to their destination, then compact them (now published)."""
    from retry_scheduler.spark.submit import (
        BULK_RETRY_APP,
        COMPACT_APP,
        bulk_retry_args,
        compact_args,
        spark_conf,
    )

    if shutil.which("java") is None:
        return Result("spark", skipped="not measured in this run: no Java on PATH (make spark-deps)")
    result = Result("spark")
    settings = env.settings("spark")
    destination = f"bench.spark-{env.tag}"
    env.create_topics([destination])
    began = time.perf_counter()
    with connect(env.url, autocommit=True) as conn:
        conn.execute(bq("bench_truncate"))
        conn.execute(
            bq("bench_fill_dead"),
            {"count": sizes.spark_rows, "destination": destination, "source": "bench.spark"},
        )
        conn.execute(bq("bench_vacuum_analyze"))
    load_s = time.perf_counter() - began
    log.info("spark: %s dead jobs stored in %.1f s", sizes.spark_rows, load_s)

    # Spark's own start-up and shutdown, the same way, with a job that does nothing: part of both figures.
    probe = env.work_dir / "spark_startup.py"
    probe.write_text(
        "from pyspark.sql import SparkSession\n\nSparkSession.builder.getOrCreate().range(1).count()\n"
    )
    _code, _nothing, startup_s = _spark(str(probe), [])

    params = {"destination": destination, "status": "dead", "dry_run": False}
    with ProcessCpu() as bulk_cpu:
        code, bulk, bulk_s = _spark(str(BULK_RETRY_APP), bulk_retry_args(params), settings)
    counts = env.job_counts()
    if code != 0 or bulk.get("published") != sizes.spark_rows or counts.get("published") != sizes.spark_rows:
        raise BenchError(f"bulk retry exited {code} with {bulk}; jobs by status now {counts}")

    archive = (env.work_dir / "archive").resolve().as_uri()
    with ProcessCpu() as compact_cpu:
        code, compact, compact_s = _spark(
            str(COMPACT_APP), compact_args(older_than="0s", archive=archive), settings
        )
    left = env.job_counts()
    if code != 0 or left:
        raise BenchError(f"compaction exited {code} with {compact}; jobs left {left}")

    bulk_floor, compact_floor = _postgres_floors(env, sizes.spark_rows, destination)
    rows = sizes.spark_rows
    cores = os.cpu_count()
    bulk_cpu_s, compact_cpu_s = bulk_cpu.seconds(), compact_cpu.seconds()
    driver_options = spark_conf()  # what run_spark_submit passed to each driver
    bulk_rate, compact_rate = round(rows / bulk_s, 1), round(rows / compact_s, 1)
    result.figures = {"spark_bulk_rows_per_s": bulk_rate, "spark_compact_rows_per_s": compact_rate}
    result.details = {
        "rows": rows,
        "load_s": round(load_s, 1),
        "spark_startup_s": round(startup_s, 1),
        "bulk": {
            "seconds": round(bulk_s, 1),
            "rows_per_s": bulk_rate,
            "rows_per_s_after_startup": round(rows / max(0.001, bulk_s - startup_s), 1),
            "result": bulk,
            "cpu_s": bulk_cpu_s,
        },
        "compact": {
            "seconds": round(compact_s, 1),
            "rows_per_s": compact_rate,
            "rows_per_s_after_startup": round(rows / max(0.001, compact_s - startup_s), 1),
            "result": compact,
            "cpu_s": compact_cpu_s,
        },
        "postgres_floor": {"bulk": bulk_floor, "compact": compact_floor},
        "master": "local[*]",
        "driver_options": driver_options,
        "limits": [
            f"Where the time went (seconds per step, from the jobs' own timings): bulk retry "
            f"{phases_text(bulk)}; compaction {phases_text(compact)}.",
            f"CPU seconds by process (sampled from /proc), bulk retry: "
            f"{cpu_use_text(bulk_cpu_s, bulk_s, cores)}; compaction: "
            f"{cpu_use_text(compact_cpu_s, compact_s, cores)}. 100 000 rows/s would give the "
            f"{rows:,} jobs {rows / 100_000 * (cores or 1):.3g} CPU seconds in all, Spark's start-up included.",
            "What limits it: everything runs on this machine's 2 cores in `local[*]` mode, next to "
            "PostgreSQL and the broker, and the JVM and Spark start-up are counted (a user waits for them). "
            "Bulk retry reads the selection over JDBC, hands it to the Python workers as Arrow batches, "
            "produces every row with librdkafka and, while it goes on producing, marks the acknowledged "
            "jobs published from a thread of each worker, 10 000 per `UPDATE` (a new version of every job "
            "row, with its index entries and WAL). "
            "Compaction counts the selection by day and stages its ids in one PostgreSQL statement, reads "
            "every column over JDBC straight into Parquet, reads the ids still selected and the archive's "
            "ids back to verify, and deletes in batches. " + budget_text(rows, bulk, compact),
            _floor_text(rows, bulk_floor, compact_floor),
            "On a cluster the read, produce and Parquet steps scale out with the executors; the `UPDATE` "
            "and the `DELETE`s stay PostgreSQL's work.",
        ],
    }
    result.notes = [
        f"Bulk retry: {rows:,} dead jobs of one destination re-published (same headers as the publish "
        f"loop) and marked published by `include/spark/bulk_retry.py` in {bulk_s:.1f} s wall time.",
        f"Compaction: the same {rows:,} jobs, now published, archived to Parquet, verified and deleted by "
        f"`include/spark/compact.py --older-than 0s` in {compact_s:.1f} s wall time.",
        "Both through `retry_scheduler.spark.submit.run_spark_submit` (what `retry-scheduler bulk-retry|compact` "
        f"runs), Spark's start-up included: {startup_s:.1f} s for a job that does nothing, measured the same "
        f"way; without it {rows / max(0.001, bulk_s - startup_s):,.0f} and "
        f"{rows / max(0.001, compact_s - startup_s):,.0f} rows/s. "
        + (
            "Each driver mapped the class archive of `make spark-deps` (`retry-scheduler dev spark-archive`)."
            if driver_options
            else "No class archive (`make spark-deps` writes one): each driver loaded Spark's classes afresh."
        ),
    ]
    return result


def _postgres_floors(env: BenchEnv, rows: int, destination: str) -> tuple[dict[str, float], dict[str, float]]:
    """PostgreSQL's part of bulk retry, then of compaction, alone, on a fresh set of the same dead jobs."""
    with connect(env.url, autocommit=True) as conn:
        conn.execute(
            bq("bench_fill_dead"), {"count": rows, "destination": destination, "source": "bench.spark"}
        )
        conn.execute(bq("bench_vacuum_analyze"))
    floors = (
        postgres_floor(env, "bench_floor_bulk_read", "bench_floor_bulk_mark", {"destination": destination}),
        postgres_floor(env, "bench_floor_compact_read", "bench_floor_compact_delete", {}),
    )
    for floor, done in zip(floors, ("marked published", "deleted"), strict=True):
        if floor["rows"] != rows:
            raise BenchError(f"PostgreSQL's part alone {done} {floor['rows']} jobs, not {rows}")
    log.info(
        "spark: PostgreSQL's part alone took %.1f s (bulk retry), %.1f s (compaction)",
        *(f["seconds"] for f in floors),
    )
    return floors


def postgres_floor(
    env: BenchEnv, read: str, write: str, params: dict[str, Any], workers: int = 2
) -> dict[str, float]:
    """PostgreSQL's own part of a PySpark job, alone: a bound on the job's speed on this machine.

    The ids of ``retry_jobs`` are split among ``workers`` connections working side by side (one per
    core); each reads its share with ``read`` (a ``COPY ... TO STDOUT``, drained unparsed), then runs
    ``write`` on it (the job's ``UPDATE`` or ``DELETE``, one statement for the share) and commits.
    Nothing goes through Spark or Kafka: whatever its other parts cost, the job cannot read and store
    its outcome faster than this.
    """
    [(low, high)] = env.sql("bench_id_bounds", fetch=True)
    step = (high - low) // workers + 1
    shares = [(low + i * step, min(high, low + (i + 1) * step - 1)) for i in range(workers)]
    ready = threading.Barrier(workers + 1)
    timings: list[tuple[float, float, float, int, int]] = []  # began, read done, written, bytes, rows
    errors: list[BaseException] = []

    def work(share_low: int, share_high: int) -> None:
        try:
            with connect(env.url) as conn:
                bound = params | {"low": share_low, "high": share_high}
                ready.wait()
                began, size = time.perf_counter(), 0
                with conn.cursor().copy(bq(read), bound) as copy:
                    for block in copy:
                        size += len(block)
                read_done = time.perf_counter()
                rows = conn.execute(bq(write), bound).rowcount
                conn.commit()
                timings.append((began, read_done, time.perf_counter(), size, rows))
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)
            ready.abort()

    threads = [threading.Thread(target=work, args=share, name="floor") for share in shares]
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        ready.wait()
    for thread in threads:
        thread.join()
    if errors:
        raise BenchError(f"PostgreSQL's part alone failed: {errors[0]}") from errors[0]
    # The wall time spans the workers' own clocks (first start to last commit), so it can never come
    # out shorter than one worker's read or write.
    seconds = max(t[2] for t in timings) - min(t[0] for t in timings)
    return {
        "seconds": round(seconds, 3),
        "read_s": round(max(t[1] - t[0] for t in timings), 3),
        "write_s": round(max(t[2] - t[1] for t in timings), 3),
        "read_bytes": sum(t[3] for t in timings),
        "rows": sum(t[4] for t in timings),
        "connections": workers,
    }


def _floor_text(rows: int, bulk: dict[str, float], compact: dict[str, float]) -> str:
    budget_s = rows / 100_000
    over = [
        job for job, floor in (("bulk retry", bulk), ("compaction", compact)) if floor["seconds"] > budget_s
    ]
    verdict = (
        f"so on this machine, at this hour, PostgreSQL alone rules the target out for {' and '.join(over)}"
        if over
        else "so PostgreSQL's part alone would fit in the target here: the rest of the time is Spark's, "
        "Python's and the broker's"
    )
    return (
        f"PostgreSQL's part alone, on a fresh set of the same {rows:,} dead jobs after the two jobs, with "
        f"no Spark and nothing produced (`bench_slow.postgres_floor`: the ids split over "
        f"{bulk['connections']} connections side by side, one per core, each reading its share as the "
        f"job does, then writing it in one statement and committing): bulk retry's read and `UPDATE` "
        f"{bulk['seconds']:.1f} s (read {bulk['read_s']:.1f}, `UPDATE` {bulk['write_s']:.1f}), at most "
        f"{rows / bulk['seconds']:,.0f} rows/s; compaction's read of every column and `DELETE` "
        f"{compact['seconds']:.1f} s (read {compact['read_s']:.1f}, `DELETE` {compact['write_s']:.1f}), at "
        f"most {rows / compact['seconds']:,.0f} rows/s. "
        f"100 000 rows/s leaves {budget_s:.3g} s, {verdict}."
    )


def budget_text(rows: int, bulk: dict[str, Any], compact: dict[str, Any]) -> str:
    """What 100 000 rows/s would allow, against the PostgreSQL statements each job cannot do without."""
    budget_s = rows / 100_000
    mark_s = bulk.get("marking_s")
    delete_s = (compact.get("phases_s") or {}).get("delete")
    if mark_s is None or delete_s is None:
        return ""
    return (
        f"100 000 rows/s would leave {budget_s:.0f} s for {rows:,} jobs, start-up included; in this run "
        f"the `UPDATE`s that mark them published kept PostgreSQL busy for {mark_s:.1f} s (summed over "
        f"the partitions, beside the producing), and the `DELETE`s of compaction took {delete_s:.1f} s."
    )


def phases_text(outcome: dict[str, Any]) -> str:
    phases = outcome.get("phases_s") or {}
    return ", ".join(f"{name.replace('_', ' ')} {seconds:.1f}" for name, seconds in phases.items()) or "n/a"


# -- lateness under the real Airflow scheduler -----------------------------------------------------------


def steady_producer(
    bootstrap: str,
    topic: str,
    destination: str,
    rate: int,
    seconds: float,
    delay_ms: int,
    tag: str,
    stop: threading.Event | None = None,
) -> int:
    """Send ``rate`` records a second for ``seconds`` (or until ``stop`` is set), each due ``delay_ms``
    after it is sent."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    tick = 0.1
    per_tick = max(1, round(rate * tick))
    sent = 0
    began = time.monotonic()
    ticks = 0
    while time.monotonic() - began < seconds and not (stop is not None and stop.is_set()):
        now_ms = int(time.time() * 1000)
        for _ in range(per_tick):
            headers = [
                (protocol.DESTINATION, destination.encode()),
                (protocol.AT, str(now_ms + delay_ms).encode()),
                (protocol.REASON, b"TimeoutError: bench"),
                (DUE_HEADER, str(now_ms + delay_ms).encode()),  # passed through: read by bench.follower
            ]
            producer.produce(
                topic,
                key=f"late-{tag}-{sent}".encode(),
                value=b'{"bench": "lateness"}',
                headers=cast(Any, headers),
            )
            sent += 1
        producer.poll(0)
        ticks += 1
        time.sleep(max(0.0, began + ticks * tick - time.monotonic()))
    if producer.flush(60):
        raise BenchError("the lateness workload was not acknowledged by the broker")
    return sent


def measure_lateness(env: BenchEnv, sizes: Sizes) -> Result:
    """Lateness of retries published by the ``retry_scheduler`` DAG under the real Airflow scheduler."""
    from retry_scheduler.dev.airflow_api import api_token, trigger_dag, unpause_dag
    from retry_scheduler.dev.demo import warm_up
    from retry_scheduler.dev.stack import DevStack

    result = Result("lateness")
    settings = env.settings("lateness").with_overrides(retry_topic="retry")
    destination = f"bench.lateness-{env.tag}"
    tag = uuid.uuid4().hex[:6]
    delay_ms = 5_000
    api_port = free_port()
    env.create_topics([destination])
    stack = DevStack(
        settings,
        api_port=api_port,
        metadata_db=f"{env.db_name}_airflow",
        airflow_home=env.work_dir / "airflow",
        say=lambda m: log.info("%s", m),
    )
    stack.log_dir = env.work_dir / "logs"
    began = time.perf_counter()
    with env.dropped_afterwards(stack.metadata_db), stack:
        startup_s = time.perf_counter() - began
        token = api_token(stack.base_url)
        unpause_dag(stack.base_url, token, "retry_scheduler")
        trigger_dag(stack.base_url, token, "retry_scheduler")
        warm = time.perf_counter()
        warm_up(settings, tag, 300)
        warmup_s = time.perf_counter() - warm
        log.info(
            "lateness: the DAG is live; %s records/s for %s s", sizes.lateness_rate, sizes.lateness_seconds
        )
        sent_box: list[int] = []
        producer = threading.Thread(
            target=lambda: sent_box.append(
                steady_producer(
                    settings.bootstrap_servers, settings.retry_topic, destination, sizes.lateness_rate,
                    sizes.lateness_seconds, delay_ms, tag,
                )
            ),
            name="bench-producer",
        )  # fmt: skip
        producer.start()
        producer.join()
        sent = sent_box[0] if sent_box else 0
        deadline = time.monotonic() + 120
        published = 0
        while time.monotonic() < deadline:
            published = env.job_counts(destination).get("published", 0)
            if published >= sent:
                break
            time.sleep(2)
        samples = [float(r[0]) for r in env.sql("bench_lateness", {"destination": destination}, fetch=True)]
    if published < sent or not samples:
        raise BenchError(f"lateness: {published} of {sent} retries published within 120 s of the last one")
    ordered = sorted(samples)
    early = sum(1 for v in samples if v < 0)
    result.figures = {"lateness_p99_s": round(percentile(ordered, 0.99), 4), "early_count": early}
    result.samples = {"lateness_s": samples}
    result.details = {
        "records": sent,
        "published": published,
        "rate_per_s": sizes.lateness_rate,
        "seconds": sizes.lateness_seconds,
        "due_after_send_ms": delay_ms,
        "p50_s": round(percentile(ordered, 0.5), 4),
        "p90_s": round(percentile(ordered, 0.9), 4),
        "p99_s": round(percentile(ordered, 0.99), 4),
        "max_s": round(ordered[-1], 4),
        "mean_s": round(statistics.fmean(samples), 4),
        "early": early,
        "stack_startup_s": round(startup_s, 1),
        "dag_warmup_s": round(warmup_s, 1),
        "limits": [
            "What limits it: the publish loop wakes at most every 100 ms (`RETRY_POLL_INTERVAL_MS`) or at "
            "the next due time, and claims a job only once `due_at` has passed; the Airflow runs hand "
            "over every minute (tasks loop 90 s); the ingest loop must have stored a record before it "
            "is due. On 2 cores the Airflow scheduler, dag processor, api-server, PostgreSQL and the "
            "broker share the CPU with the loops.",
        ],
    }
    result.notes = [
        f"{sent:,} retries sent at {sizes.lateness_rate}/s for {sizes.lateness_seconds} s to the retry topic, "
        f"each due {delay_ms / 1000:.0f} s after it was sent, while the real Airflow scheduler ran the "
        f"`retry_scheduler` DAG (dev stack: scheduler, dag processor, triggerer, api-server, LocalExecutor).",
        f"Lateness = broker acknowledgement time minus due time: p50 {percentile(ordered, 0.5):.3f} s, p99 {percentile(ordered, 0.99):.3f} s, "
        f"max {ordered[-1]:.3f} s; {early} published early.",
        f"Not timed: the stack's start-up ({startup_s:.0f} s) and the first DAG run going live "
        f"({warmup_s:.0f} s, a warm-up record).",
    ]
    return result
