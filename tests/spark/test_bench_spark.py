"""The benchmark's PySpark measurement in small: both jobs through spark-submit, their step timings and
the CPU each kind of process used, as the report explains the figures with them (no timing asserted)."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from retry_scheduler.bench import BenchOptions, Sizes, run_bench
from retry_scheduler.config import Settings
from tests.conftest import ADMIN_URL

pytestmark = pytest.mark.integration

ROWS = 5_000


@pytest.fixture(scope="module")
def spark_report(tmp_path_factory: pytest.TempPathFactory, bootstrap_servers: str, jdbc_jar: str) -> dict:
    out = tmp_path_factory.mktemp("bench-spark")
    options = BenchOptions(
        out=out,
        quick=True,
        only=("spark",),
        sizes=replace(Sizes.quick(), spark_rows=ROWS),
        db_name=f"retry_bench_spark_{uuid.uuid4().hex[:8]}",
        bootstrap=bootstrap_servers,
    )
    run_bench(Settings(database_url=ADMIN_URL), options, say=lambda _m: None)
    return json.loads((Path(out) / "report.json").read_text())


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
        assert cpu["Spark JVM"] > 0 and cpu["PostgreSQL"] > 0, cpu
        assert list(cpu.values()) == sorted(cpu.values(), reverse=True)
    assert details["bulk"]["cpu_s"]["Spark Python workers"] > 0
    limits = " ".join(details["limits"])
    assert "CPU seconds by process (sampled from /proc), bulk retry: " in limits
    assert f"100 000 rows/s would give the {ROWS:,} jobs" in limits
