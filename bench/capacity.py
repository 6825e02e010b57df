"""Capacity under the real Airflow scheduler: the highest retry rate the whole loop sustains, and
publish throughput with one and with two Celery workers.

``sustained_retries_per_s``: the ``retry_scheduler`` DAG runs under the dev stack's scheduler while
records are sent to ``retry`` at a fixed rate for a window, each due a few seconds later; a rate
is sustained when every record of the window is published, none early, with p99 lateness at most
``MAX_P99_S`` and flat (its last minute's p99 at most ``MAX_RISE_S`` above its first minute's). The
rate steps up until one is not sustained (or the steps run out). A consumer follows the destination
through each window (:mod:`bench.follower`), as the application it is retried to would.

``publish_rows_per_s_1_worker`` / ``_2_workers``: the same number of due jobs is published by the DAG
on the CeleryExecutor with one and then two Celery workers (``RETRY_PUBLISH_TASKS=2`` publish tasks
per run, so two workers have something to share), timed from the first acknowledgement to the last;
one Celery stack serves both runs, its second worker added between them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from bench.cpu import ProcessCpu, cpu_shares, cpu_times, rss_by_kind
from bench.env import BenchEnv, BenchError, Result, insert_due_jobs, per_second
from bench.follower import Follower
from bench.sizes import Sizes
from bench.slow import steady_producer
from bench.timeline import MAX_P99_S, late_text, lateness_timeline, percentile
from bench.waits import stored_from, wait_published
from retry_scheduler.dev.procs import free_port

log = logging.getLogger(__name__)

#: Each record of the capacity workload is due this long after it is sent.
DUE_IN_MS = 5_000
#: A sustained rate's lateness is flat: the p99 of its window's last minute of due time is at most
#: this much above its first minute's (a rise that goes on grows without bound in a longer window).
MAX_RISE_S = 0.25


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set environment variables for the Airflow processes a stack starts (they copy os.environ)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _stack(env: BenchEnv, name: str, **options: Any) -> Any:
    from retry_scheduler.dev.stack import DevStack

    stack = DevStack(
        env.settings(name).with_overrides(retry_topic="retry"),
        api_port=free_port(),
        metadata_db=f"{env.db_name}_{name}_airflow",
        airflow_home=env.work_dir / f"airflow-{name}",
        say=lambda m: log.info("%s", m),
        **options,
    )
    stack.log_dir = env.work_dir / f"logs-{name}"
    return stack


@contextlib.contextmanager
def live_stack(env: BenchEnv, name: str) -> Iterator[Any]:
    """A dev stack with the ``retry_scheduler`` DAG live under its real scheduler, for measurement ``name``.

    The measurement's own (started here; stopped, and its Airflow metadata dropped, when the block
    ends), unless the run shares one (``env.share_stack``): then the first measurement starts it and
    the rest use it as it is until the run ends. A stack's start costs about a CPU minute, which the
    tests' short runs (a few seconds of traffic each) share; a full run gives each measurement a
    fresh stack, so that none measures another's history."""
    if env.share_stack:
        if env.shared_stack is None:
            env.shared_stack = env.stacks.enter_context(_started(env, "shared"))
        yield env.shared_stack
        return
    with _started(env, name) as stack:
        yield stack


@contextlib.contextmanager
def _started(env: BenchEnv, name: str) -> Iterator[Any]:
    stack = _stack(env, name)
    with env.dropped_afterwards(stack.metadata_db), stack:
        _go_live(stack, stack.settings)
        yield stack


def _go_live(stack: Any, settings: Any) -> None:
    from retry_scheduler.dev.airflow_api import api_token, trigger_dag, unpause_dag
    from retry_scheduler.dev.demo import warm_up

    token = api_token(stack.base_url)
    unpause_dag(stack.base_url, token, "retry_scheduler")
    trigger_dag(stack.base_url, token, "retry_scheduler")
    warm_up(settings, uuid.uuid4().hex[:6], 300)


def _step(
    env: BenchEnv, settings: Any, rate: int, seconds: int, metadata_url: str, label: str = ""
) -> dict[str, Any]:
    """One rate for one window: how many were sent and published, their lateness, and when it was late.

    ``label`` tells apart the destinations of windows at the same rate."""
    destination = f"bench.capacity-{env.tag}-{rate}{'-' + label if label else ''}"
    env.create_topics([destination])
    sent_box: list[int] = []
    producer = threading.Thread(
        target=lambda: sent_box.append(
            steady_producer(
                settings.bootstrap_servers, settings.retry_topic, destination, rate, seconds, DUE_IN_MS,
                uuid.uuid4().hex[:6],
            )
        ),
        name="bench-capacity-producer",
    )  # fmt: skip
    stored_before = stored_from(env, settings.retry_topic)  # the stack sends it nothing of its own now
    rss_before = rss_by_kind()
    with Follower(settings.bootstrap_servers, destination) as follower:
        machine_before, began = cpu_times(), time.time()
        with ProcessCpu() as cpu:
            producer.start()
            producer.join()
        machine = cpu_shares(machine_before, cpu_times())
        rss_after = rss_by_kind()
        sent = sent_box[0] if sent_box else 0
        published = wait_published(env, settings.retry_topic, stored_before, sent, destination, 120)
        follower.wait_for(published, 30)
    seen = follower.figures()
    samples = sorted(float(r[0]) for r in env.sql("bench_lateness", {"destination": destination}, fetch=True))
    p99 = percentile(samples, 0.99) if samples else None
    early = sum(1 for s in samples if s < 0)
    timeline = lateness_timeline(env, destination, metadata_url, began, time.time())
    rise = timeline["p99_rise_s"]
    sustained = (
        published >= sent > 0 and early == 0 and p99 is not None and p99 <= MAX_P99_S
        and (rise is None or rise <= MAX_RISE_S)
    )  # fmt: skip
    step = {
        "destination": destination,
        "rate_per_s": rate,
        "seconds": seconds,
        "began_at": round(began, 3),
        "sent": sent,
        "sent_per_s": per_second(sent, seconds),
        "published": published,
        "p50_s": round(statistics.median(samples), 4) if samples else None,
        "p99_s": round(p99, 4) if p99 is not None else None,
        "max_s": round(samples[-1], 4) if samples else None,
        "early": early,
        "sustained": sustained,
        "machine_cpu": machine,
        **seen,
        "rss_mib": {kind: [round(rss_before.get(kind, 0.0)), round(mib)] for kind, mib in rss_after.items()},
        **cpu_budget(cpu.seconds(), sent),
        **timeline,
    }
    log.info("capacity: %s", step)
    return step


#: The processes whose CPU is the loop's own work: the two tasks and the ingest worker processes.
LOOP_KINDS = ("ingest task", "ingest workers", "publish task")


def cpu_budget(cpu_s: dict[str, float], retries: int) -> dict[str, Any]:
    """Where the CPU of a window went: each kind of process's core-milliseconds per 1 000 retries, and
    the loop's own microseconds of CPU per retry (``LOOP_KINDS``)."""
    if retries <= 0:
        return {"cpu_s": cpu_s, "core_ms_per_1000": {}, "loop_cpu_us_per_retry": None}
    return {
        "cpu_s": cpu_s,
        "core_ms_per_1000": {kind: round(s * 1e6 / retries, 1) for kind, s in cpu_s.items()},
        "loop_cpu_us_per_retry": round(sum(cpu_s.get(k, 0.0) for k in LOOP_KINDS) * 1e6 / retries, 1),
    }


def loop_vs_parts(results: dict[str, Result]) -> None:
    """Add ``loop_cpu_us_per_retry`` (the highest sustained step's) and ``loop_vs_parts`` (that over the
    CPU per record of the ingest and publish loops measured alone in the same run) to the capacity
    result, or say why they are missing."""
    capacity = results.get("capacity")
    if capacity is None or capacity.skipped:
        return
    steps = [
        s for s in capacity.details.get("steps") or [] if s["sustained"] and s.get("loop_cpu_us_per_retry")
    ]
    if not steps:
        why = "no rate was sustained" if capacity.details.get("steps") else "no capacity rates were given"
        capacity.details["why_loop_cpu_us_per_retry"] = why
        capacity.details["why_loop_vs_parts"] = why
        return
    step = max(steps, key=lambda s: s["rate_per_s"])
    loop_us = step["loop_cpu_us_per_retry"]
    capacity.figures["loop_cpu_us_per_retry"] = loop_us
    parts = {name: results.get(name) for name in ("ingest", "publish")}
    alone = {
        name: (r.details.get("cpu_us_per_record") if r is not None and not r.skipped else None)
        for name, r in parts.items()
    }
    if alone["ingest"] is None or alone["publish"] is None:
        capacity.details["why_loop_vs_parts"] = (
            "not measured: needs the ingest and publish measurements in the same run "
            "(--only ingest,publish,capacity)"
        )
        return
    ratio_ = round(loop_us / (alone["ingest"] + alone["publish"]), 3)
    capacity.figures["loop_vs_parts"] = ratio_
    ingest_us = sum(step["core_ms_per_1000"].get(k, 0.0) for k in ("ingest task", "ingest workers"))
    publish_us = step["core_ms_per_1000"].get("publish task", 0.0)
    capacity.details["loop_vs_parts"] = {
        "rate_per_s": step["rate_per_s"], "loop_us": loop_us, "loop_ingest_us": ingest_us,
        "loop_publish_us": publish_us, "alone_ingest_us": alone["ingest"], "alone_publish_us": alone["publish"],
    }  # fmt: skip
    capacity.notes.append(
        f"CPU per retry at {step['rate_per_s']:,}/s, the loop under Airflow against its parts alone in this run "
        f"(each at full speed, its worker processes' start included): ingest {ingest_us:.1f} µs vs "
        f"{alone['ingest']} µs alone ({ingest_us / alone['ingest']:.2f}x), publish {publish_us:.1f} µs vs "
        f"{alone['publish']} µs alone ({publish_us / alone['publish']:.2f}x); in all {loop_us} µs vs "
        f"{alone['ingest'] + alone['publish']:.1f} µs: loop_vs_parts {ratio_}x. Under Airflow the loops "
        "work in smaller batches (a steady rate, not a backlog) and each run starts its tasks and worker "
        "processes anew; alone, the ingest's worker processes start once for the whole backlog."
    )


def budget_text(step: dict[str, Any]) -> str:
    """A step's CPU budget as a sentence of the report."""
    kinds = ", ".join(f"{kind} {ms:,.0f}" for kind, ms in step["core_ms_per_1000"].items() if ms >= 0.5)
    busy = (step.get("machine_cpu") or {}).get("busy_pct")
    return (
        f"CPU at {step['rate_per_s']:,}/s, core-milliseconds per 1 000 retries: {kinds}; the loop's own "
        f"(ingest and publish tasks, ingest workers) {step['loop_cpu_us_per_retry']} µs per retry"
        + (f"; the machine {busy:g} % busy." if busy is not None else ".")
        + _consumer_text(step)
    )


def _consumer_text(step: dict[str, Any]) -> str:
    """What the consumer following the destination saw, and the broker's memory, as report text."""
    text = ""
    if step.get("at_consumer_p99_s") is not None:
        text += (
            f" A consumer following the destination received {step['at_consumer_received']:,} records, "
            f"arrival less due time p50 {step['at_consumer_p50_s']} s, p99 {step['at_consumer_p99_s']} s, "
            f"worst {step['at_consumer_max_s']} s, {step['at_consumer_early']} early."
        )
    broker = (step.get("rss_mib") or {}).get("broker")
    if broker:
        text += (
            f" The broker's resident memory: {broker[0]} MiB before the window, {broker[1]} MiB at its end."
        )
    return text


def _publish_with_celery(env: BenchEnv, sizes: Sizes) -> list[dict[str, Any]]:
    """Publish ``sizes.capacity_publish_rows`` due jobs through the DAG on each of
    ``sizes.capacity_celery_workers`` Celery workers, fewest first, on one Celery stack: between
    counts the DAG is paused, its run ended and workers are added (one stack's start, about a CPU
    minute, instead of one per count)."""
    counts = sorted(set(sizes.capacity_celery_workers))
    if not counts:
        return []
    # A shared stack's scheduler left running on the database would publish this run's backlog.
    env.close_stacks()
    stack = _stack(
        env,
        "celery",
        executor="celery",
        celery_workers=counts[0],
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
    )
    runs = []
    with _environ(RETRY_PUBLISH_TASKS="2"), env.dropped_afterwards(stack.metadata_db), stack:
        stack.wait_for_celery_workers()
        for workers in counts:
            if workers > stack.celery_workers:
                _end_dag_runs(env, stack)
                stack.add_celery_workers(workers - stack.celery_workers)
            runs.append(_publish_run(env, stack, sizes))
    return runs


def _end_dag_runs(env: BenchEnv, stack: Any) -> None:
    """Pause the ``retry_scheduler`` DAG, fail its unfinished runs and wait until none is left: the
    next publish run's tasks are then queued afresh, to be shared by every worker."""
    from retry_scheduler.dev.airflow_api import (
        api_token,
        fail_unfinished_runs,
        set_paused,
        wait_for_dag_run,
    )

    token = api_token(stack.base_url)
    set_paused(stack.base_url, token, "retry_scheduler", True)
    deadline = time.monotonic() + 120
    for run_id in fail_unfinished_runs(stack.base_url, token, "retry_scheduler"):
        wait_for_dag_run(
            stack.base_url, token, "retry_scheduler", run_id, timeout=max(1.0, deadline - time.monotonic())
        )
    # The failed runs' tasks were told to stop: their loops end after the round in hand.
    while int(env.sql("bench_live_loops", {}, fetch=True)[0][0]):
        if time.monotonic() > deadline:
            raise BenchError("capacity: the failed runs' loops were still running 120 s later")
        time.sleep(1)


def _publish_run(env: BenchEnv, stack: Any, sizes: Sizes) -> dict[str, Any]:
    """One publish run on the stack's current Celery workers, from a backlog stored before the DAG
    goes live (the timed span is publishing alone)."""
    workers, settings = stack.celery_workers, stack.settings
    destination = f"bench.celery-{env.tag}-{workers}"
    env.create_topics([destination])
    load_s = insert_due_jobs(
        settings.database_url, sizes.capacity_publish_rows, f"bench.celery{workers}", destination
    )
    _go_live(stack, settings)
    # The jobs were stored beforehand: nothing to wait for but their publishing.
    published = wait_published(env, settings.retry_topic, 0, 0, destination, 600)
    span = env.sql("bench_published_span", {"destination": destination}, fetch=True)[0]
    if published < sizes.capacity_publish_rows:
        raise BenchError(
            f"capacity: {published} of {sizes.capacity_publish_rows} jobs published on {workers} worker(s)"
        )
    seconds = float(span[0] or 0.0)
    return {
        "workers": workers,
        "publish_tasks_per_run": 2,
        "rows": published,
        "seconds": round(seconds, 3),
        "rows_per_s": per_second(published, seconds),
        "load_s": round(load_s, 3),
    }


def measure_capacity(env: BenchEnv, sizes: Sizes) -> Result:
    """Sustained retries/s under the real scheduler, and publish rows/s on 1 and 2 Celery workers."""
    result = Result("capacity")
    autovacuum = env.sql("bench_autovacuum", {}, fetch=True)[0][0] == "on"
    steps: list[dict[str, Any]] = []
    if sizes.capacity_rates:
        with live_stack(env, "capacity") as stack:
            settings = stack.settings
            metadata_url = stack.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
            for rate in sizes.capacity_rates:
                steps.append(_step(env, settings, rate, sizes.capacity_seconds, metadata_url))
                if not steps[-1]["sustained"]:
                    break
    celery = _publish_with_celery(env, sizes)
    result.details = {
        "steps": steps, "celery": celery, "max_p99_s": MAX_P99_S, "due_in_ms": DUE_IN_MS, "autovacuum": autovacuum,
    }  # fmt: skip
    result.notes = []
    if steps:
        result.figures["sustained_retries_per_s"] = sustained = max(
            (s["rate_per_s"] for s in steps if s["sustained"]), default=0
        )
        # The figure with the server's settings as found is the one above; this one only where they
        # had autovacuum on (a server setting: the benchmark does not change it).
        if autovacuum:
            result.figures["sustained_retries_per_s_autovacuum_on"] = sustained
        else:
            result.details["why_sustained_retries_per_s_autovacuum_on"] = (
                "not measured: the server ran with autovacuum off; run the capacity measurement again on a "
                "server with it on (ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf();)"
            )
        first_miss = next((s for s in steps if not s["sustained"]), None)
        result.notes += [
            f"Rates stepped through {', '.join(str(s['rate_per_s']) for s in steps)} records/s for "
            f"{sizes.capacity_seconds} s each, every record due {DUE_IN_MS / 1000:.0f} s after it was sent, while "
            "the real Airflow scheduler ran the retry_scheduler DAG (LocalExecutor); sustained means all "
            f"published, none early, p99 lateness <= {MAX_P99_S:.0f} s, and flat (the last minute's p99 at most "
            f"{MAX_RISE_S:g} s above the first minute's): {sustained:,} records/s.",
            (
                f"Not sustained at {first_miss['rate_per_s']:,}/s: {first_miss['published']:,} of {first_miss['sent']:,} "
                f"published within 120 s of the window, p99 {first_miss['p99_s']} s, {first_miss['early']} early, "
                f"p99 rise {first_miss.get('p99_rise_s')} s."
                if first_miss
                else "Every step was sustained: the capacity is above the last step."
            ),
        ]  # fmt: skip
    else:
        for key in ("sustained_retries_per_s", "sustained_retries_per_s_autovacuum_on"):
            result.details[f"why_{key}"] = "not measured: no capacity rates were given in this run"
    for run in celery:
        workers = run["workers"]
        result.figures[f"publish_rows_per_s_{workers}_worker{'s' if workers > 1 else ''}"] = run["rows_per_s"]
    if celery:
        result.notes.append(
            f"{sizes.capacity_publish_rows:,} due jobs published by the DAG on the CeleryExecutor with 2 publish "
            "tasks per run: "
            + ", ".join(
                f"{c['rows_per_s']:,.0f} rows/s on {c['workers']} worker{'s' if c['workers'] > 1 else ''}"
                for c in celery
            )
            + " (first acknowledgement to last; the workers share this machine's 2 cores with PostgreSQL)."
        )
    result.notes += [
        *[budget_text(step) for step in steps if step.get("core_ms_per_1000")],
        *[late_text(step) for step in steps if step.get("timeline")],
        "The PostgreSQL server ran with autovacuum on, as production servers do."
        if autovacuum
        else "WARNING: the PostgreSQL server ran with autovacuum off: dead entries pile up at the head of "
        "the due index, every claim walks them, and lateness grows with the length of the run; these "
        "figures are lower than a server with autovacuum (PostgreSQL's default) gives.",
    ]
    return result
