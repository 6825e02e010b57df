"""A soak: the whole loop at a fixed rate for half an hour, under the real Airflow scheduler.

``soak_p99_drift``: records are sent at ``soak_rate`` (half the capacity target) for ``soak_seconds``,
each due 5 s after it is sent; the p99 lateness of the records due in the last ``DRIFT_WINDOW_S``
over that of the first (target: at most 1.2, lateness that does not creep up as the run goes on).
Each window's lateness is split into send -> stored (the ingest's part) and due -> acknowledged (the
publish loop's part).
Every ``SAMPLE_EVERY_S`` the run records ``retry_jobs``' dead and live rows and sizes
(``table_timeline``), and every ``RSS_EVERY_S`` the resident memory of each kind of process
(``rss_timeline``): none may grow without bound. Every ``CPU_EVERY_S`` the CPU each kind of process
has used so far (``cpu_timeline``): ``cpu_drift`` compares each kind's core-milliseconds per 1 000
retries over the first and the last drift window, which says where a drift's work went. PostgreSQL's
own counters are sampled as often (``pg_activity_timeline``: blocks read and hit, rows, scans of
``retry_jobs``, autovacuum runs, checkpoints, WAL): ``pg_activity_drift`` compares each per 1 000
retries the same way, which says what the server's sessions did more of when their CPU rises.
Both drifts end with the traffic: the samples taken after it (the benchmark's own reading of the
run, a full scan of the published jobs or three) are kept in the timelines and left out of the
windows. And every ``CPU_EVERY_S`` a fresh process times a fixed Python loop in CPU seconds
(``host_speed_timeline``): a host that slows down as the run goes on (these machines' speed varies by
the hour) makes every process spend more CPU per retry, which is not the service's drift.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.capacity import DUE_IN_MS, _step, live_stack
from bench.cpu import ProcessCpu, rss_by_kind
from bench.env import BenchEnv, Result
from bench.held import periodic_samples, table_sampler
from bench.sizes import Sizes
from bench.timeline import lateness_between

log = logging.getLogger(__name__)

#: The drift compares the p99 of the records due in the first and in the last this many seconds.
DRIFT_WINDOW_S = 300
RSS_EVERY_S = 30.0
#: How often the CPU each kind of process has used so far is sampled (``cpu_timeline``).
CPU_EVERY_S = 60.0
#: The last drift window's p99 may be at most this times the first's.
MAX_DRIFT = 1.2
#: The host's speed: the CPU seconds a fresh Python process spends on this many additions.
SPEED_LOOP = 2_000_000
_SPEED_PROBE = (
    "import time\nt = time.process_time()\ns = 0\n"
    f"for i in range({SPEED_LOOP}):\n    s += i\n"
    "print(time.process_time() - t)"
)


def rss_sampler() -> contextlib.AbstractContextManager[list[list[Any]]]:
    """Sample :func:`rss_by_kind` every :data:`RSS_EVERY_S` while the block runs, and once more at its
    end: [seconds from the start, {kind: MB}]."""
    return periodic_samples(rss_by_kind, RSS_EVERY_S, "memory", final=True)


def growth(samples: list[list[Any]]) -> dict[str, float]:
    """Each kind's memory at the end over its memory a third of the way in (after the warm-up), in MB:
    the kinds running at both times (a kind of task that ended meanwhile did not grow or shrink)."""
    if len(samples) < 3:
        return {}
    early, last = samples[len(samples) // 3][1], samples[-1][1]
    return {kind: round(last[kind] - mb, 1) for kind, mb in early.items() if mb >= 1 and kind in last}


def measure_soak(env: BenchEnv, sizes: Sizes) -> Result:
    """The loop for ``sizes.soak_seconds`` at ``sizes.soak_rate``: lateness drift, table and memory."""
    result = Result("soak")
    autovacuum = env.sql("bench_autovacuum", {}, fetch=True)[0][0] == "on"
    rate, seconds = sizes.soak_rate, sizes.soak_seconds
    window = min(DRIFT_WINDOW_S, seconds // 4)
    with live_stack(env, "soak") as stack:
        settings = stack.settings
        metadata_url = stack.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        with (
            table_sampler(env) as table,
            rss_sampler() as rss,
            ProcessCpu(interval_s=1.0) as cpu,
            periodic_samples(cpu.running_seconds, CPU_EVERY_S, "CPU", final=True) as cpu_timeline,
            periodic_samples(lambda: pg_activity(env), CPU_EVERY_S, "PostgreSQL activity", final=True) as pg,
            periodic_samples(host_speed, CPU_EVERY_S, "host speed") as speed,
        ):
            began = time.time()
            step = _step(env, settings, rate, seconds, metadata_url, label="soak")
    # Records are due DUE_IN_MS after they are sent: the windows are of due time.
    due_began = began + DUE_IN_MS / 1000
    spans = {
        name: lateness_between(env, step["destination"], since, since + window)
        for name, since in (("first", due_began), ("last", due_began + seconds - window))
    }
    first, last = spans["first"]["p99_s"], spans["last"]["p99_s"]
    result.figures = {
        "soak_p99_drift": round(last / first, 3) if first and last is not None else None,
        "soak_p99_s": step["p99_s"],
    }
    grown = growth(rss)
    # The traffic's end: its last records fall due DUE_IN_MS after they are sent.
    end_s = seconds + DUE_IN_MS / 1000
    cpu_drift = cpu_per_retry_drift(cpu_timeline, rate, window, end_s=end_s)
    pg_drift = per_retry_drift(pg, rate, window, scale=1.0, end_s=end_s)
    speed_drift = window_medians(speed, window, end_s)
    result.details = {
        "rate_per_s": rate, "seconds": seconds, "drift_window_s": window, "spans": spans, "step": step,
        "table_timeline": table, "rss_timeline": rss, "rss_growth_mb": grown, "max_drift": MAX_DRIFT,
        "cpu_timeline": cpu_timeline, "cpu_drift": cpu_drift,
        "pg_activity_timeline": pg, "pg_activity_drift": pg_drift,
        "host_speed_timeline": speed, "host_speed_drift": speed_drift,
        "autovacuum": autovacuum,
    }  # fmt: skip
    if not first:
        result.details["why_soak_p99_drift"] = "no record was published in the first window"
    tables = [row[3] for row in table]
    thirds = len(tables) // 3
    result.notes = [
        f"{rate:,} records/s for {seconds:,} s under the Airflow scheduler (autovacuum "
        f"{'on' if autovacuum else 'off'}): {step['published']:,} of {step['sent']:,} published, "
        f"{step['early']} early, p99 {step['p99_s']} s, max {step['max_s']} s.",
        f"p99 of the records due in the first {window} s: {first} s; in the last {window} s: {last} s "
        f"(drift {result.figures['soak_p99_drift']}).",
        "Split: send -> stored p99 "
        + " / ".join(f"{spans[n]['stored_p99_s']} s" for n in ("first", "last"))
        + " (first / last window), due -> acknowledged p99 "
        + " / ".join(f"{spans[n]['p99_s']} s" for n in ("first", "last"))
        + ".",
        f"retry_jobs: {min(tables, default=0)}-{max(tables, default=0)} MB over the run "
        f"(the last third at most {max(tables[-thirds:], default=0) if thirds else '-'} MB), at most "
        f"{max((r[1] for r in table), default=0):,} dead rows.",
        "Resident memory from a third of the way in to the end, MB: "
        + (
            ", ".join(f"{kind} {mb:+g}" for kind, mb in sorted(grown.items(), key=lambda kv: -abs(kv[1])))
            or "-"
        )
        + ".",
        "CPU by kind of process, core-ms per 1 000 retries in the first and the last drift window: "
        + (
            ", ".join(
                f"{kind} {d['first']:g} -> {d['last']:g}"
                for kind, d in sorted(cpu_drift.items(), key=lambda kv: -abs(kv[1]["last"] - kv[1]["first"]))
            )
            or "-"
        )
        + ".",
        "PostgreSQL's work per 1 000 retries in the first and the last drift window (what changed most "
        "first): "
        + (
            ", ".join(
                f"{what} {d['first']:g} -> {d['last']:g}"
                for what, d in sorted(pg_drift.items(), key=lambda kv: -_change(kv[1]))[:8]
            )
            or "-"
        )
        + ".",
        f"The host's speed, a Python loop of {SPEED_LOOP:,} additions in CPU seconds (median of the first "
        f"and of the last drift window): {speed_drift['first']} -> {speed_drift['last']} s"
        + (
            f" ({speed_drift['last'] / speed_drift['first']:.2f}x: every process's CPU per retry moves with it)."
            if speed_drift["first"] and speed_drift["last"]
            else "."
        ),
    ]
    return result


def host_speed() -> float:
    """The CPU seconds a fresh Python process spends on :data:`SPEED_LOOP` additions (CPU time, not
    wall time: how fast the host runs code, not how busy the run keeps it)."""
    out = subprocess.run([sys.executable, "-c", _SPEED_PROBE], capture_output=True, text=True, check=True)
    return round(float(out.stdout), 4)


def window_medians(timeline: list[list[Any]], window_s: int, end_s: float) -> dict[str, float | None]:
    """The median of a timeline's values ([seconds, value]) in its first ``window_s`` and in the last
    ``window_s`` before ``end_s``: ``{first, last}``, None for a window without a sample."""

    def median(low: float, high: float) -> float | None:
        values = [row[1] for row in timeline if low <= row[0] <= high]
        return round(statistics.median(values), 4) if values else None

    return {"first": median(0, window_s), "last": median(end_s - window_s, end_s)}


def pg_activity(env: BenchEnv) -> dict[str, float]:
    """PostgreSQL's cumulative counters so far (``bench_pg_activity``): {what: count}."""
    return {what: float(n or 0) for what, n in env.sql("bench_pg_activity", {}, fetch=True)[0][0].items()}


def _change(d: dict[str, float]) -> float:
    """How much a figure changed from the first drift window to the last, as a ratio (either way)."""
    low, high = sorted((d["first"], d["last"]))
    return high / low if low > 0 else (float("inf") if high > 0 else 1.0)


def cpu_per_retry_drift(
    timeline: list[list[Any]], rate: int, window_s: int, end_s: float | None = None
) -> dict[str, dict[str, float]]:
    """Each kind's core-milliseconds per 1 000 retries sent over the first ``window_s`` of the
    timeline and over its last (from the cumulative samples nearest those bounds): ``{kind: {first,
    last}}``, the kinds that used at least 0.1 core-ms per 1 000 in either."""
    return per_retry_drift(timeline, rate, window_s, scale=1000.0, end_s=end_s)


def per_retry_drift(
    timeline: list[list[Any]], rate: int, window_s: int, scale: float, end_s: float | None = None
) -> dict[str, dict[str, float]]:
    """Each cumulative figure of ``timeline`` ([seconds, {name: so far}]) per 1 000 retries sent, times
    ``scale`` (1 000 turns CPU seconds into milliseconds), over the first ``window_s`` and over the
    last (from the samples nearest those bounds): ``{name: {first, last}}``, those at least 0.1 in
    either. The last window ends at the last sample taken by ``end_s`` (the traffic's end): what ran
    after it, the benchmark's own reading of the run, is no retry's work."""
    if end_s is not None:
        timeline = [row for row in timeline if row[0] <= end_s]
    if len(timeline) < 3:
        return {}

    def at(seconds: float) -> list[Any]:
        return min(timeline, key=lambda row: abs(row[0] - seconds))

    end = timeline[-1][0]
    spans = {"first": (timeline[0], at(window_s)), "last": (at(end - window_s), timeline[-1])}
    drift: dict[str, dict[str, float]] = {}
    for name, (start, stop) in spans.items():
        retries = rate * (stop[0] - start[0])
        for kind, used in stop[1].items():
            per_1000 = scale * (used - start[1].get(kind, 0.0)) / retries * 1000 if retries > 0 else 0.0
            drift.setdefault(kind, {"first": 0.0, "last": 0.0})[name] = round(per_1000, 1)
    return {kind: d for kind, d in drift.items() if max(d.values()) >= 0.1}
