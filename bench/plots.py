"""The report's PNG plots (matplotlib): throughput against baselines, lateness, claim cost."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.env import Result


log = logging.getLogger(__name__)


def _lateness_lines(ax: Any, timeline: list[list[Any]]) -> None:
    """A window's lateness by due second (a capacity step's, a held-snapshot window's, the burst's
    steady traffic's, the soak's): its worst and its p99, against the 1 s target."""
    at = [row[0] for row in timeline]
    ax.plot(at, [row[3] for row in timeline], color="#d62728", linewidth=0.8, label="worst")
    ax.plot(at, [row[2] for row in timeline], color="#1f77b4", linewidth=0.8, label="p99")
    ax.axhline(1.0, color="#555555", linestyle="--", linewidth=0.6)
    ax.set_ylabel("lateness (s)", fontsize=8)


def _save(plt: Any, fig: Any, out: Path, name: str, made: list[str]) -> None:
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    made.append(name)


def write_plots(report: dict[str, Any], results: list[Result], out: Path) -> list[str]:
    """throughput.png (ours vs baselines); lateness.png and capacity.png (each capacity step's lateness
    over time, with the loops' task starts and ends) and held_snapshot.png (lateness and dead rows over
    time, alone and with a snapshot held) and burst.png (the steady traffic's lateness, the burst's
    records stored and published per second) and soak.png (lateness, the table's size and the
    processes' memory over the soak) when those were measured."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no plots (pip install -e '.[bench]')")
        return []
    made: list[str] = []
    m = report["measurements"]
    bars: list[tuple[str, str, float]] = []  # group, label, rows/s
    ingest = (m.get("ingest") or {}).get("details") or {}
    if ingest.get("rows_per_s"):
        bars.append(("ingest", "retry-scheduler ingest", ingest["rows_per_s"]))
        if (ingest.get("baseline") or {}).get("rows_per_s"):
            bars.append(("ingest", "PostgreSQL COPY", ingest["baseline"]["rows_per_s"]))
    publish = (m.get("publish") or {}).get("details") or {}
    if publish.get("rows_per_s"):
        bars.append(("publish", "retry-scheduler publish", publish["rows_per_s"]))
        pgq = publish.get("baseline_pgqueuer") or {}
        if pgq.get("rows_per_s"):
            bars.append(("publish", f"PgQueuer, batch {pgq['batch_size']}", pgq["rows_per_s"]))
        best = pgq.get("best_tuned") or {}
        if best.get("rows_per_s") and best.get("batch_size") != pgq.get("batch_size"):
            bars.append(("publish", f"PgQueuer, batch {best['batch_size']}", best["rows_per_s"]))
        if (publish.get("baseline_naive") or {}).get("rows_per_s"):
            bars.append(("publish", "naive poller", publish["baseline_naive"]["rows_per_s"]))
    spark = (m.get("spark") or {}).get("details") or {}
    for key, label in (("bulk", "Spark bulk retry"), ("compact", "Spark compaction")):
        if (spark.get(key) or {}).get("rows_per_s"):
            bars.append(("spark", label, spark[key]["rows_per_s"]))
    if bars:
        fig, ax = plt.subplots(figsize=(9, 0.5 * len(bars) + 1.6))
        ys = list(range(len(bars)))[::-1]  # first bar on top
        widths = [b[2] for b in bars]
        ax.barh(
            ys,
            widths,
            color=[
                "#1f77b4"
                if b[1].startswith("retry-scheduler")
                else "#2ca02c"
                if b[0] == "spark"
                else "#aaaaaa"
                for b in bars
            ],
        )
        for y, w in zip(ys, widths, strict=True):
            ax.text(w, y, f" {w:,.0f}", va="center", fontsize=8)
        ax.set_yticks(ys, [f"{b[1]} ({b[0]})" for b in bars], fontsize=8)
        ax.set_xscale("log")
        ax.set_xlim(right=max(widths) * 4)
        ax.set_xlabel("rows per second (log scale)")
        title = "Throughput: ours (blue), baselines (grey) measured in the same run, PySpark jobs (green)"
        ax.set_title(title + (" [quick run]" if report["quick"] else ""), fontsize=9)
        _save(plt, fig, out, "throughput.png", made)
    samples = next((r.samples.get("lateness_s") for r in results if r.name == "lateness"), None)
    if samples:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        ax.hist(samples, bins=80, color="#1f77b4")
        p99 = report.get("lateness_p99_s")
        if p99 is not None:
            ax.axvline(p99, color="#d62728", linestyle="--", label=f"p99 {p99:.3f} s")
        if max(samples) >= 0.5:  # the target's line only where it does not squash the histogram
            ax.axvline(1.0, color="#555555", linestyle=":", label="target: p99 <= 1.0 s")
        ax.set_xlabel("publish time minus due time (s); target: p99 <= 1.0 s, none early")
        ax.set_ylabel("records")
        ax.set_yscale("log")
        ax.legend()
        ax.set_title(f"Lateness of {len(samples):,} retries under the Airflow scheduler", fontsize=10)
        _save(plt, fig, out, "lateness.png", made)
    steps = [
        s for s in (((m.get("capacity") or {}).get("details") or {}).get("steps") or []) if s.get("timeline")
    ]
    if steps:
        fig, axes = plt.subplots(len(steps), 1, figsize=(9, 2.2 * len(steps) + 0.8), squeeze=False)
        for ax, step in zip(axes[:, 0], steps, strict=True):
            _lateness_lines(ax, step["timeline"])
            for style, key in ((":", "task_starts"), ("-.", "task_ends")):
                for task, at_s in step.get(key) or []:
                    color = "#2ca02c" if task == "ingest" else "#aaaaaa"
                    ax.axvline(at_s, color=color, linestyle=style, linewidth=0.8)
            ax.set_title(f"{step['rate_per_s']:,} retries/s", fontsize=9)
        axes[0, 0].legend(fontsize=7, loc="upper right")
        axes[-1, 0].set_xlabel(
            "seconds of due time from the step's start; an ingest (green) or publish (grey) task "
            "started (dotted) or ended (dash-dot)"
        )
        _save(plt, fig, out, "capacity.png", made)
    windows = [
        w
        for w in (((m.get("held_snapshot") or {}).get("details") or {}).get("windows") or [])
        if w.get("timeline")
    ]
    if windows:
        fig, axes = plt.subplots(len(windows), 1, figsize=(9, 2.6 * len(windows) + 0.8), squeeze=False)
        for ax, window in zip(axes[:, 0], windows, strict=True):
            _lateness_lines(ax, window["timeline"])
            job = window.get("spark")
            beside = {
                "held": "snapshot held open",
                "spark": f"a Spark bulk retry of {(job or {}).get('rows', 0):,} dead jobs (shaded) beside",
            }.get(window["window"], "alone")
            ax.set_title(f"{window['rate_per_s']:,} retries/s, {beside}", fontsize=9)
            if job:
                ax.axvspan(job["from_s"], job["to_s"], color="#ff7f0e", alpha=0.15, linewidth=0)
            table = window.get("table_timeline") or []
            if table:
                rows = ax.twinx()
                rows.plot(
                    [r[0] for r in table],
                    [r[1] for r in table],
                    color="#2ca02c",
                    linewidth=0.8,
                    label="dead rows",
                )
                rows.set_ylabel("retry_jobs dead rows", fontsize=8, color="#2ca02c")
                rows.legend(fontsize=7, loc="upper center")
        axes[0, 0].legend(fontsize=7, loc="upper left")
        axes[-1, 0].set_xlabel(
            "seconds from the window's start (lateness by due second; dead rows sampled every 5 s)"
        )
        _save(plt, fig, out, "held_snapshot.png", made)
    burst = ((m.get("burst") or {}).get("details")) or {}
    if (burst.get("steady") or {}).get("timeline") and burst.get("burst_timeline"):
        fig, (late_ax, rate_ax) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
        _lateness_lines(late_ax, burst["steady"]["timeline"])
        late_ax.set_title(
            f"Steady traffic ({burst['steady']['rate_per_s']:,}/s, due in 5 s) through a burst of "
            f"{burst['records']:,} retries",
            fontsize=9,
        )
        late_ax.legend(fontsize=7, loc="upper left")
        timeline = burst["burst_timeline"]
        at = [row[0] for row in timeline]
        rate_ax.plot(at, [row[1] for row in timeline], color="#2ca02c", linewidth=0.8, label="stored/s")
        rate_ax.plot(at, [row[2] for row in timeline], color="#9467bd", linewidth=0.8, label="published/s")
        rate_ax.set_ylabel("burst records per second", fontsize=8)
        rate_ax.legend(fontsize=7, loc="upper right")
        for ax in (late_ax, rate_ax):
            ax.axvline(burst.get("burst_began_s", 0), color="#aaaaaa", linestyle=":", linewidth=0.8)
        rate_ax.set_xlabel(
            "seconds from the steady traffic's start (lateness by due second; the burst began at the dotted line)"
        )
        _save(plt, fig, out, "burst.png", made)
    soak = ((m.get("soak") or {}).get("details")) or {}
    if (soak.get("step") or {}).get("timeline"):
        fig, (late_ax, size_ax) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
        _lateness_lines(late_ax, soak["step"]["timeline"])
        late_ax.set_title(f"Soak: {soak['rate_per_s']:,} retries/s for {soak['seconds']:,} s", fontsize=9)
        late_ax.legend(fontsize=7, loc="upper left")
        table = soak.get("table_timeline") or []
        size_ax.plot([r[0] for r in table], [r[3] for r in table], color="black", label="retry_jobs MB")
        size_ax.set_ylabel("retry_jobs MB (black)", fontsize=8)
        rss = soak.get("rss_timeline") or []
        if rss:
            memory = size_ax.twinx()
            largest = sorted(rss[-1][1], key=lambda kind: -rss[-1][1][kind])[:5]
            for kind in largest:
                memory.plot([r[0] for r in rss], [r[1].get(kind) for r in rss], linewidth=0.8, label=kind)
            memory.set_ylabel("resident memory MB", fontsize=8)
            memory.legend(fontsize=6, loc="upper right")
        size_ax.set_xlabel("seconds from the soak's start (lateness by due second)")
        _save(plt, fig, out, "soak.png", made)
    return made


# -- report.md ----------------------------------------------------------------------------------------
