"""Capacity under the real Airflow scheduler: the highest retry rate the whole loop sustains, and
publish throughput with one and with two Celery workers.

``sustained_retries_per_s``: the ``retry_scheduler`` DAG runs under the dev stack's scheduler while
records are sent to ``retry`` at a fixed rate for a window, each due a few seconds later; a rate
is sustained when every record of the window is published, none early, with p99 lateness at most
``MAX_P99_S``. The rate steps up until one is not sustained (or the steps run out).

``publish_rows_per_s_1_worker`` / ``_2_workers``: the same number of due jobs is published by the DAG
on the CeleryExecutor with one and then two Celery workers (``RETRY_PUBLISH_TASKS=2`` publish tasks
per run, so two workers have something to share), timed from the first acknowledgement to the last;
one Celery stack serves both runs, its second worker added between them.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from bench.cpu import ProcessCpu, cpu_shares, cpu_times, rss_by_kind
from bench.env import BenchEnv, BenchError, Result, Sizes, insert_due_jobs, per_second
from bench.follower import Follower
from bench.queries import bq
from bench.slow import steady_producer
from bench.waits import stored_from, wait_published
from retry_scheduler.dev.procs import free_port

log = logging.getLogger(__name__)

#: Lateness above this at p99 means the rate is not sustained.
MAX_P99_S = 1.0
#: Each record of the capacity workload is due this long after it is sent.
DUE_IN_MS = 5_000
#: A sustained rate's lateness is flat: the p99 of its window's last minute of due time is at most
#: this much above its first minute's (a rise that goes on grows without bound in a longer window).
MAX_RISE_S = 0.25
#: Lateness is also given by slices of due time this long (``p99_by_slice``), to see it rise or stay.
SLICE_S = 30
#: A handover's gap is the longest time with nothing stored within this many seconds of an ingest
#: task's end (a loop ends once a newer one has taken over).
HANDOVER_NEAR_S = 15.0


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
    p99 = samples[min(len(samples) - 1, int(0.99 * len(samples)))] if samples else None
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


def lateness_timeline(
    env: BenchEnv, destination: str, metadata_url: str, began: float, ended: float
) -> dict[str, Any]:
    """When a step's records were late: for each second of due time (seconds from the step's start)
    its count, p99 and worst lateness (``timeline``), when the DAG's tasks running in the window
    started and ended (``task_starts``, ``task_ends``: a loop ends when a newer one takes over), and
    each second with a record later than ``MAX_P99_S`` with the task start and the task end just
    before it (``late_seconds``).

    Whether lateness stays flat: the p99 of each ``SLICE_S`` of due time (``p99_by_slice``: start,
    count, p99) and ``p99_rise_s``, the last minute's p99 less the first minute's. The ingest's gaps
    (:func:`store_gaps`): the longest time nothing of the destination was stored, at each ingest
    handover and in the whole window."""
    import psycopg

    from retry_scheduler.core.config import libpq_url

    rows = env.sql("bench_lateness_timeline", {"destination": destination}, fetch=True)
    timeline = [
        [round(second - began), int(n), round(p99, 3), round(worst, 3)] for second, n, p99, worst in rows
    ]
    with psycopg.connect(libpq_url(metadata_url), autocommit=True) as conn:
        found = conn.execute(bq("bench_task_times"), {"since": began, "until": ended}).fetchall()
    starts = [[task, round(start - began, 1)] for task, start, _end in found]
    ends = [[task, round(end - began, 1)] for task, _start, end in found if end is not None and end <= ended]

    def last_before(events: list[list[Any]], offset: int) -> tuple[Any, float | None]:
        before = [(task, at) for task, at in events if at <= offset]
        task, at = before[-1] if before else (None, None)
        return task, round(offset - at, 1) if at is not None else None

    late = []
    for offset, _n, _p99, worst in timeline:
        if worst > MAX_P99_S:
            start_task, started_s = last_before(starts, offset)
            end_task, ended_s = last_before(ends, offset)
            late.append({
                "at_s": offset, "max_s": worst, "after_task": start_task, "task_started_s_before": started_s,
                "after_task_end": end_task, "task_ended_s_before": ended_s,
            })  # fmt: skip
    slices = [
        [round(start), int(n), round(p99, 3)]
        for start, n, p99 in env.sql(
            "bench_lateness_slices",
            {"destination": destination, "since": began, "width": SLICE_S},
            fetch=True,
        )
    ]
    stored_at = [
        float(row[0]) for row in env.sql("bench_store_times", {"destination": destination}, fetch=True)
    ]
    # Two runs' ingest tasks may end together (a late run catching up): one handover.
    handovers: list[float] = []
    for at in sorted(at + began for task, at in ends if task == "ingest"):
        if not handovers or at - handovers[-1] > 1.0:
            handovers.append(round(at, 3))
    return {
        "timeline": timeline, "task_starts": starts, "task_ends": ends, "late_seconds": late,
        "p99_by_slice": slices, "p99_rise_s": p99_rise(env, destination, began, slices),
        **store_gaps(stored_at, handovers),
    }  # fmt: skip


def p99_rise(env: BenchEnv, destination: str, began: float, slices: list[list[Any]]) -> float | None:
    """The p99 lateness of the last minute of a destination's due times less its first minute's (its
    due times span ``slices``, from ``began``); None when they span under three minutes."""
    if not slices:
        return None
    first_due, last_due = began + slices[0][0], began + slices[-1][0] + SLICE_S
    if last_due - first_due < 180:
        return None
    first = lateness_between(env, destination, first_due, first_due + 60)["p99_s"]
    last = lateness_between(env, destination, last_due - 60, last_due)["p99_s"]
    return round(last - first, 4) if first is not None and last is not None else None


def store_gaps(stored_at: list[float], handovers: list[float]) -> dict[str, Any]:
    """The ingest's gaps, from the times a destination's jobs were stored (``stored_at``, sorted epoch s)
    and the ends of the ingest tasks (``handovers``, epoch s): ``handover_gaps_s``, for each handover
    inside the stored span, the longest time with nothing stored within ``HANDOVER_NEAR_S`` of it; their
    p50 and worst (``handover_gap_p50_s``, ``handover_gap_max_s``); and the window's longest time with
    nothing stored (``store_gap_max_s``, with its start ``store_gap_max_at``, epoch s)."""
    pairs = list(itertools.pairwise(stored_at))
    gaps = []
    for at in handovers:
        if not pairs or not stored_at[0] < at < stored_at[-1]:
            continue  # the window's first loop, or one that ended after the traffic did
        near = [b - a for a, b in pairs if b >= at - HANDOVER_NEAR_S and a <= at + HANDOVER_NEAR_S]
        gaps.append(round(max(near), 3))
    widest = max(pairs, key=lambda p: p[1] - p[0], default=None)
    return {
        "handover_gaps_s": gaps,
        "handover_gap_p50_s": round(statistics.median(gaps), 3) if gaps else None,
        "handover_gap_max_s": max(gaps) if gaps else None,
        "store_gap_max_s": round(widest[1] - widest[0], 3) if widest else None,
        "store_gap_max_at": round(widest[0], 3) if widest else None,
    }


def seconds(value: float | None) -> float | None:
    """A figure in seconds as the reports give it (to 0.1 ms), or None."""
    return round(float(value), 4) if value is not None else None


def lateness_between(env: BenchEnv, destination: str, since: float, until: float) -> dict[str, Any]:
    """A destination's published records due from ``since`` to ``until`` (epoch s): how many, their p99
    and worst lateness (due -> acknowledged), how many were early, and the p99 and worst of send ->
    stored (``stored_p99_s``, ``stored_max_s``: the record's timestamp to its ingest transaction)."""
    count, p99, worst, early, stored_p99, stored_worst = env.sql(
        "bench_lateness_between", {"destination": destination, "since": since, "until": until}, fetch=True
    )[0]

    return {
        "published": int(count),
        "p99_s": seconds(p99),
        "max_s": seconds(worst),
        "early": int(early),
        "stored_p99_s": seconds(stored_p99),
        "stored_max_s": seconds(stored_worst),
    }


def late_text(step: dict[str, Any]) -> str:
    """Where a step's lateness came from, as a sentence of the report: whether it stayed flat, the
    ingest's gaps, and the seconds with a record later than ``MAX_P99_S``."""
    return f"{_flat_text(step)} {_gaps_text(step)} {_late_seconds_text(step)}".strip()


def _flat_text(step: dict[str, Any]) -> str:
    slices = step.get("p99_by_slice") or []
    if not slices:
        return ""
    p99s = ", ".join(f"{p99:g}" for _start, _n, p99 in slices)
    rise = step.get("p99_rise_s")
    return f"At {step['rate_per_s']:,}/s the p99 of each {SLICE_S} s of due time was {p99s} s" + (
        f" (last minute less first: {rise:+g} s)." if rise is not None else "."
    )


def _gaps_text(step: dict[str, Any]) -> str:
    gaps = step.get("handover_gaps_s")
    if gaps is None:
        return ""
    widest = step.get("store_gap_max_s")
    return (
        f"Ingest handovers: {len(gaps)}; the longest time with nothing stored near one: "
        + (
            f"p50 {step['handover_gap_p50_s']} s, worst {step['handover_gap_max_s']} s"
            if gaps
            else "none to measure"
        )
        + f"; the window's longest time with nothing stored: {widest} s."
    )


def _late_seconds_text(step: dict[str, Any]) -> str:
    late, seconds = step.get("late_seconds") or [], len(step.get("timeline") or [])
    if not late:
        return f"At {step['rate_per_s']:,}/s no second of due time had a record later than {MAX_P99_S:g} s."
    worst = max(late, key=lambda s: s["max_s"])
    return (
        f"At {step['rate_per_s']:,}/s, {len(late)} of {seconds} seconds of due time had a record later than "
        f"{MAX_P99_S:g} s; the worst, {worst['max_s']} s, at +{worst['at_s']} s into the step, "
        f"{worst['task_started_s_before']} s after {_a(worst['after_task'])} task started"
        + (
            f" and {worst['task_ended_s_before']} s after {_a(worst['after_task_end'])} task ended."
            if worst.get("after_task_end")
            else "."
        )
    )


def _a(task: str | None) -> str:
    return "an ingest" if task == "ingest" else f"a {task}"


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
