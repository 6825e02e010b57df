"""Where the CPU went during a measurement: the machine's shares (/proc/stat) and each kind of process's
seconds; and each kind's resident memory (``rss_by_kind``)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

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


#: Airflow's processes by what their command line (or title) holds, first match wins; a task's process
#: is titled with its task instance id only, so the loops add their own name (``loop_title``).
_AIRFLOW_KINDS = (
    ("retry-scheduler ingest loop", "ingest task"),
    ("retry-scheduler publish loop", "publish task"),
    ("loops.ingest_process import worker_main", "ingest workers"),
    ("LocalExecutor: <idle>", "airflow executor"),
    ("LocalExecutor:", "task supervisors"),
    ("airflow supervisor:", "task supervisors"),
    ("airflow task supervisor:", "task supervisors"),
    ("airflow worker --", "other tasks"),
    ("airflow scheduler", "airflow scheduler"),
    ("airflow dag-processor", "airflow dag-processor"),
    ("airflow triggerer", "airflow triggerer"),
    ("airflow api_server", "airflow api-server"),
    ("airflow api-server", "airflow api-server"),
    ("airflow serve-logs", "airflow serve-logs"),
    ("celery", "celery worker"),
    ("from bench.env import produce_records", "load generator"),  # the burst's producer process
)


def process_kind(pid: int, comm: str, cmdline: str) -> str:
    """Which part of the system a process is, for :class:`ProcessCpu`."""
    if pid == os.getpid():
        return "benchmark"
    if comm == "postgres":
        return _postgres_kind(cmdline)
    if comm == "java":
        return "broker" if " kafka.Kafka " in f" {cmdline} " else "Spark JVM"
    if comm.startswith("python") and ("pyspark.daemon" in cmdline or "pyspark.worker" in cmdline):
        return "Spark Python workers"
    if comm.startswith("python") and (
        "include/spark/" in cmdline or "retry_scheduler/spark/jobs/" in cmdline
    ):
        return "Spark Python driver"
    if _retitled(comm):
        return next((kind for marker, kind in _AIRFLOW_KINDS if marker in cmdline), "other")
    return "other"


def _postgres_kind(cmdline: str) -> str:
    """A PostgreSQL backend by the database it serves (its title: ``postgres: 15/main: USER DB HOST
    STATE``): Airflow's metadata databases (their names hold ``airflow``, as the dev stacks' and the
    benchmark's do) or the service's; the server's own processes (and connections too short to be
    sampled, counted through the postmaster) apart."""
    words = cmdline.split()
    # With a cluster_name (Debian's clusters: "15/main:") the user, database and host come after it.
    host = next((i for i, word in enumerate(words[:6]) if "(" in word), None)
    if words[:1] == ["postgres:"] and host is not None and host >= 3:
        return "PostgreSQL: Airflow's metadata" if "airflow" in words[host - 1] else "PostgreSQL: service"
    return "PostgreSQL: server"


def _retitled(comm: str) -> bool:
    """Whether a process of this name may change its title while it runs (Airflow's workers do)."""
    return comm.startswith(("python", "airflow", "celery", "[celery"))


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
    Airflow's scheduler, the loops' tasks, ...) between entering and leaving the context, from /proc
    sampled every ``interval_s`` by a thread.

    A process running throughout counts what it used meanwhile, each interval for what it was then
    (an Airflow executor worker is idle, then a task's supervisor). One that ends inside the window
    counts in full through its parent, once the parent has waited for it (PostgreSQL's backends,
    Python workers): what the parent's children used beyond what was sampled of them counts for the
    parent's kind. A process that execs another program (spark-submit's shell script becomes the
    JVM) counts as what it became.
    """

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self._seen: dict[tuple[int, int], _Process] = {}
        self._used: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-cpu", daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        #: The sampling thread's own CPU, which is not the benchmark's work (left out of it).
        self._sampler_s = 0.0

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
                process.own = process.start_own
            if process.comm != seen.comm or _retitled(seen.comm):  # new, exec'd, or maybe retitled
                process.comm = seen.comm
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as raw:
                        cmdline = raw.read().replace(b"\0", b" ").decode("utf-8", "replace")
                except OSError:
                    cmdline = ""
                process.kind = process_kind(int(pid), seen.comm, cmdline)
            # What it used since the last sample counts for what it is now.
            self._used[process.kind] = self._used.get(process.kind, 0) + seen.own - process.own
            # (its parent now: an orphan is adopted by init or a subreaper, whose count of reaped
            # children then holds it)
            process.own, process.children, process.ppid = seen.own, seen.children, seen.ppid
        if last:
            for key, process in self._seen.items():
                process.alive = key in alive

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()
        self._sampler_s = time.thread_time()

    def __enter__(self) -> ProcessCpu:
        self._sample(first=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(last=True)

    def running_seconds(self) -> dict[str, float]:
        """CPU seconds by kind so far, while the window runs: what was sampled of each process (the
        children that ended, counted by :meth:`seconds` through their parents, left out)."""
        used = dict(self._used)
        return {kind: round(t / self._tick, 2) for kind, t in used.items() if t > 0}

    def seconds(self) -> dict[str, float]:
        """CPU seconds by kind of process, largest first (kinds that used none left out)."""
        used = dict(self._used)
        # By parent pid: what its children that ended had used in all, which its own count of reaped
        # children now holds: what was counted of them inside the window, and for one that was already
        # running at the start, what it had used before (which belongs to no one here).
        ended: dict[int, int] = {}
        for (_pid, _started), p in self._seen.items():
            if not p.alive:
                ended[p.ppid] = ended.get(p.ppid, 0) + p.own + p.children
        for (pid, _started), p in self._seen.items():
            # Children the parent waited for in the window, beyond what was sampled of them.
            unseen = p.children - p.start_children - ended.get(pid, 0)
            if unseen > 0:
                used[p.kind] = used.get(p.kind, 0) + unseen
        if "benchmark" in used:
            used["benchmark"] = max(0, used["benchmark"] - round(self._sampler_s * self._tick))
        ranked = sorted(((t / self._tick, kind) for kind, t in used.items() if t > 0), reverse=True)
        return {kind: round(seconds, 2) for seconds, kind in ranked}


def part_cpu(cpu_s: dict[str, float], records: int, kinds: tuple[str, ...]) -> dict[str, Any]:
    """A part measured alone (the benchmark's own process running the ingest or publish loop, and its
    worker processes): its processes' CPU and their microseconds of CPU per record (``kinds``)."""
    own = sum(cpu_s.get(kind, 0.0) for kind in kinds)
    return {
        "cpu_s": cpu_s,
        "cpu_kinds": list(kinds),
        "cpu_us_per_record": round(own * 1e6 / records, 1) if records > 0 else None,
    }


def rss_by_kind() -> dict[str, float]:
    """Resident memory (MB) of every process of the machine, summed by kind (:func:`process_kind`)."""
    page = os.sysconf("SC_PAGE_SIZE")
    totals: dict[str, float] = {}
    for pid in (name for name in os.listdir("/proc") if name.isdigit()):
        seen = _proc_cpu(pid)
        try:
            with open(f"/proc/{pid}/statm") as statm:
                rss = int(statm.read().split()[1]) * page
            cmdline = ""
            if seen is not None and (seen.comm in ("postgres", "java") or _retitled(seen.comm)):
                with open(f"/proc/{pid}/cmdline", "rb") as raw:
                    cmdline = raw.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if seen is None or rss == 0:  # kernel threads have no resident memory of their own
            continue
        kind = process_kind(int(pid), seen.comm, cmdline)
        totals[kind] = totals.get(kind, 0.0) + rss / 2**20
    return {kind: round(mb, 1) for kind, mb in sorted(totals.items())}


def cpu_use_text(cpu_s: dict[str, float], wall_s: float, cores: int | None) -> str:
    """``ProcessCpu.seconds`` against what the machine's cores had in ``wall_s``."""
    used = ", ".join(f"{kind} {seconds:.1f}" for kind, seconds in cpu_s.items() if seconds >= 0.05)
    total = sum(cpu_s.values())
    available = f" of the {wall_s * cores:.1f} that {cores} cores have" if cores else ""
    return f"{used}: {total:.1f} CPU seconds in {wall_s:.1f} s{available}"
