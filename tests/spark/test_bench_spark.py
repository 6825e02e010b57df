"""The benchmark's PySpark measurement in small: both jobs through spark-submit, their step timings and
the CPU each kind of process used, as the report explains the figures with them (no timing asserted,
so it runs beside other tests: the CPU it reports of each kind of process then counts theirs too)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bench.measure import Sizes
from tests.benchutil import once_per_run, run_measurement

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROWS = 5_000


@pytest.fixture(scope="module")
def spark_report(tmp_path_factory: pytest.TempPathFactory, bootstrap_servers: str, jdbc_jar: str) -> dict:
    def measure(out: Path) -> None:
        run_measurement(out, bootstrap_servers, "spark", replace(Sizes.quick(), spark_rows=ROWS))

    # The three tests read the report only: one run serves them wherever xdist sends them.
    return json.loads((once_per_run(tmp_path_factory, "bench-spark", measure) / "report.json").read_text())


def test_both_jobs_ran_on_every_job(spark_report: dict) -> None:
    spark = spark_report["measurements"]["spark"]
    assert spark["skipped"] is None, spark["skipped"]
    details = spark["details"]
    assert details["bulk"]["result"]["published"] == ROWS
    assert details["compact"]["result"]["deleted"] == ROWS
    assert spark_report["spark_bulk_rows_per_s"] > 0 and spark_report["spark_compact_rows_per_s"] > 0


def test_the_cpu_of_each_kind_of_process_is_reported(spark_report: dict) -> None:
    details = spark_report["measurements"]["spark"]["details"]
    for job in ("bulk", "compact"):
        cpu = details[job]["cpu_s"]
        # The JVM and PostgreSQL work in both jobs; bulk retry also runs Python workers (mapInArrow).
        # (A JDBC partition's connection may open and close between two samples: its backend's CPU
        # then counts through the postmaster that reaped it, as "PostgreSQL: server".)
        postgres = sum(seconds for kind, seconds in cpu.items() if kind.startswith("PostgreSQL: "))
        assert cpu["Spark JVM"] > 0 and postgres > 0, cpu
        assert list(cpu.values()) == sorted(cpu.values(), reverse=True)
    assert details["bulk"]["cpu_s"]["Spark Python workers"] > 0
    limits = " ".join(details["limits"])
    assert "CPU seconds by process (sampled from /proc), bulk retry: " in limits
    assert f"100 000 rows/s would give the {ROWS:,} jobs" in limits


def test_postgresql_alone_is_measured_as_the_bound(spark_report: dict) -> None:
    # PostgreSQL's part of each job, alone, on a fresh set of the same jobs: every job read and
    # written once, over two connections, and the report says what rate it would allow at most.
    details = spark_report["measurements"]["spark"]["details"]
    floors = details["postgres_floor"]
    for job in ("bulk", "compact"):
        floor = floors[job]
        assert floor["rows"] == ROWS and floor["connections"] == 2
        assert floor["read_bytes"] > ROWS * 100  # every row's key, value and columns were read
        assert 0 < max(floor["read_s"], floor["write_s"]) <= floor["seconds"]
    # The jobs' figures came first: the floor's fresh set is written and gone afterwards.
    assert details["bulk"]["result"]["published"] == ROWS
    limits = " ".join(details["limits"])
    bulk_max = ROWS / floors["bulk"]["seconds"]
    assert f"bulk retry's read and `UPDATE` {floors['bulk']['seconds']:.1f} s" in limits
    assert f"at most {bulk_max:,.0f} rows/s" in limits
    assert "PostgreSQL alone rules the target out" in limits or "would fit in the target here" in limits
