"""A window's lateness over time under the scheduler: second by second and by slices of due time,
whether it stays flat, the ingest's gaps (at each loop handover and in the whole window), and the
report's sentences about them. Used by every measurement that runs traffic through a live stack
(capacity, held snapshot, burst, soak, handover)."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from bench.env import BenchEnv
from bench.queries import bq

#: Lateness above this at p99 means the rate is not sustained.
MAX_P99_S = 1.0
#: Lateness is also given by slices of due time this long (``p99_by_slice``), to see it rise or stay.
SLICE_S = 30
#: A handover's gap is the longest time with nothing stored within this many seconds of an ingest
#: task's end (a loop ends once a newer one has taken over).
HANDOVER_NEAR_S = 15.0


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


def percentile(ordered: list[float], q: float) -> float:
    """The ``q``-quantile (0 to 1) of ``ordered`` (sorted, not empty): the value at the nearest rank
    below, as every figure of the benchmark takes it."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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
