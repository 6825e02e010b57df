"""The machine a benchmark ran on: its cores, memory, versions, PostgreSQL's settings, and a speed
probe taken at the start of the run (to compare runs), for the report's "Machine" section."""

from __future__ import annotations

import logging
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from retry_scheduler.db.connection import connect
from retry_scheduler.dev.kafka_libs import KAFKA_VERSION

log = logging.getLogger(__name__)


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
def machine_info(database_url: str, own_broker: bool = True) -> dict[str, Any]:
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
    info["broker"] = (
        f"Apache Kafka {KAFKA_VERSION} (KRaft, one node, the dev tooling's)"
        if own_broker
        else "external (KAFKA_BOOTSTRAP_SERVERS)"
    )
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
