"""The benchmark harness in small: every report file and key, baselines from the same run, no timings asserted."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

from bench.measure import BenchOptions, Sizes, run_bench
from bench.report import TARGETS
from retry_scheduler.core.config import Settings
from tests.benchutil import once_per_run
from tests.conftest import ADMIN_URL

pytestmark = [pytest.mark.integration, pytest.mark.long]

SIZES = replace(Sizes.quick(), ingest_warmup=200, pgqueuer_rows=1_000, naive_rows=100)
DB_NAME = f"retry_bench_test_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory, bootstrap_servers: str) -> Path:
    def measure(out: Path) -> None:
        options = BenchOptions(
            out=out,
            quick=True,
            only=("ingest", "publish", "claim", "ordered", "fairness"),
            sizes=SIZES,
            db_name=DB_NAME,
            bootstrap=bootstrap_servers,
        )
        steps: list[tuple[int, int]] = []
        run_bench(
            Settings(database_url=ADMIN_URL),
            options,
            say=lambda _m: None,
            progress=lambda *s: steps.append(s),
        )
        assert steps == [(n, 5) for n in range(6)]  # the command's progress: one step per measurement
        (out / "db_name").write_text(DB_NAME)

    # The tests below read what the run wrote only (its database's name included): one run serves
    # them wherever xdist sends them.
    return once_per_run(tmp_path_factory, "bench", measure)


@pytest.fixture(scope="module")
def report(report_dir: Path) -> dict:
    return json.loads((report_dir / "report.json").read_text())


def test_report_files_exist(report_dir: Path) -> None:
    for name in ("report.json", "report.md", "throughput.png"):
        assert (report_dir / name).stat().st_size > 0, name
    assert (report_dir / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_key_is_reported(report: dict) -> None:
    for key in TARGETS:
        assert key in report, key
        assert key in report["targets"], key
    assert report["quick"] is True
    machine = report["machine"]
    assert machine["cores"] >= 1 and machine["memory_gib"] > 0
    assert machine["postgresql"].startswith("PostgreSQL")
    assert machine["packages"]["confluent-kafka"]
    # the run was given the tests' broker: said as a broker of the user's, not the run's own
    assert machine["broker"] == "external (KAFKA_BOOTSTRAP_SERVERS)"
    assert all(value > 0 for value in machine["calibration"].values())  # the machine's speed, timed
    # How the machine's CPU went (busy, idle, stolen by the hypervisor): over the run and each measurement.
    assert abs(sum(machine["cpu_during_run"].values()) - 100) <= 0.2
    for name in ("ingest", "publish", "claim"):
        assert set(report["measurements"][name]["details"]["cpu"]) == {"busy_pct", "idle_pct", "steal_pct"}


def test_ordered_modes_cost_is_measured(report: dict, report_dir: Path) -> None:
    """bench.ordered: the helper with and without ordered mode, and chains behind failed heads."""
    figures = report["measurements"]["ordered"]["figures"]
    assert report["measurements"]["ordered"]["skipped"] is None
    for key in ("plain_records_per_s", "ordered_records_per_s", "ordered_vs_plain", "parking_records_per_s",
                "held_step_p50_s", "held_step_p99_s", "held_chain_drain_s"):  # fmt: skip
        assert isinstance(figures[key], int | float) and figures[key] > 0, (key, figures[key])
    # Each parked record: its park and the hold recording it, and the hold after it was handled.
    assert figures["round_trips_per_parked_record"] >= 3
    assert "## Ordered mode's cost" in (report_dir / "report.md").read_text()


def test_fair_publishing_is_measured_beside_a_flood_and_alone(report: dict, report_dir: Path) -> None:
    """bench.fairness: the small stream's lateness beside another destination's flood, and alone;
    every small job published once and none early in both runs, each figure from its own run."""
    fairness = report["measurements"]["fairness"]
    assert fairness["skipped"] is None
    details = fairness["details"]
    for run in (details["beside_flood"], details["alone"]):
        assert run["small"]["published"] == SIZES.fairness_small and run["small"]["early"] == 0, run
    assert details["beside_flood"]["flood"]["published"] == SIZES.fairness_flood
    alone = fairness["figures"]["fairness_small_alone_p99_s"]
    assert alone == details["alone"]["small"]["p99_s"] and alone >= 0
    beside = fairness["figures"]["fairness_small_p99_s"]
    if details["beside_flood"]["flood_left_when_small_done"] > 0:  # quick sizes may drain the flood first
        assert beside == details["beside_flood"]["small"]["p99_s"] and beside >= 0
    else:
        assert beside is None and "drained" in report["not_measured"]["fairness_small_p99_s"]
    assert "## Fair publishing" in (report_dir / "report.md").read_text()


def test_measured_figures_are_positive(report: dict) -> None:
    for key in ("ingest_msgs_per_s", "ingest_vs_copy", "publish_rows_per_s", "publish_vs_pgqueuer",
                "publish_vs_naive", "claim_cost_ratio_10m_vs_10k"):  # fmt: skip
        assert isinstance(report[key], int | float) and report[key] > 0, (key, report[key])
    ingest = report["measurements"]["ingest"]["details"]
    # The loop's first report of stored rows (its worker processes starting) is kept apart from the
    # timed rows; when that first report already held every row, as this small run's can (2 000 rows,
    # batches of 5 000), the whole loop is timed instead (``bench.timed_from``) and the report says so.
    if ingest["loop_start_timed"]:
        assert ingest["first_batch_rows"] == 0 and ingest["loop_start_s"] == 0
    else:
        assert ingest["first_batch_rows"] > 0 and ingest["loop_start_s"] > 0
    assert ingest["timed_rows"] > 0
    assert ingest["first_batch_rows"] + ingest["timed_rows"] == SIZES.ingest_records
    publish = report["measurements"]["publish"]["details"]
    assert publish["rows"] == publish["records_on_topic"] == SIZES.publish_rows
    claim = report["measurements"]["claim"]["details"]
    assert (claim["small"]["rows"], claim["large"]["rows"]) == (SIZES.claim_small, SIZES.claim_large)
    # Each part's CPU alone (for loop_vs_parts): its loop's processes, per record it handled.
    assert ingest["cpu_kinds"] == ["benchmark", "ingest workers"] and ingest["cpu_s"]["ingest workers"] > 0
    assert publish["cpu_kinds"] == ["benchmark"] and publish["cpu_s"]["benchmark"] > 0
    assert ingest["cpu_us_per_record"] > 0 and publish["cpu_us_per_record"] > 0


def test_baselines_were_measured_in_the_same_run(report: dict) -> None:
    start, end = datetime.fromisoformat(report["started_at"]), datetime.fromisoformat(report["finished_at"])
    for name in ("ingest", "publish", "claim"):
        m = report["measurements"][name]
        assert m["skipped"] is None, m["skipped"]
        assert (
            start
            <= datetime.fromisoformat(m["started_at"])
            <= datetime.fromisoformat(m["finished_at"])
            <= end
        )
    ingest = report["measurements"]["ingest"]["details"]
    assert ingest["baseline"]["rows"] == SIZES.ingest_records  # the very same records
    assert ingest["baseline"]["rows_per_s"] > 0
    publish = report["measurements"]["publish"]["details"]
    assert publish["baseline_pgqueuer"]["rows"] == SIZES.pgqueuer_rows
    assert publish["baseline_pgqueuer"]["rows_per_s"] > 0
    assert publish["baseline_naive"]["rows"] == SIZES.naive_rows
    assert publish["baseline_naive"]["rows_per_s"] > 0
    # Each ratio is the figure over the baseline of this very report.
    assert report["ingest_vs_copy"] == pytest.approx(
        ingest["rows_per_s"] / ingest["baseline"]["rows_per_s"], rel=0.01
    )
    assert report["publish_vs_naive"] == pytest.approx(
        publish["rows_per_s"] / publish["baseline_naive"]["rows_per_s"], rel=0.01
    )


def test_unmeasured_figures_are_null_with_a_reason(report: dict, report_dir: Path) -> None:
    for key in (
        "lateness_p99_s",
        "early_count",
        "spark_bulk_rows_per_s",
        "spark_compact_rows_per_s",
        "loop_vs_parts",
    ):
        assert report[key] is None
        assert report["not_measured"][key].startswith("not "), report["not_measured"][key]
        assert report["targets"][key]["pass"] is None
    # A quick run's claim sizes are not the target's: reported, but neither pass nor fail.
    assert report["targets"]["claim_cost_ratio_10m_vs_10k"]["pass"] is None
    md = (report_dir / "report.md").read_text()
    assert "| figure | value | baseline | target | pass |" in md
    for key in TARGETS:
        assert f"`{key}`" in md
    assert "not selected with --only" in md
    assert "% stolen by the hypervisor" in md
    assert "Machine speed at the start of the run" in md


def test_the_benchmark_database_is_dropped(report: dict, report_dir: Path) -> None:
    db_name = (report_dir / "db_name").read_text()
    assert db_name.startswith("retry_bench_test_")
    with psycopg.connect(ADMIN_URL) as conn:
        row = conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (db_name,)).fetchone()
    assert row == (0,)


def test_the_command_prints_the_report_as_json_and_its_progress_apart(tmp_path: Path) -> None:
    """``retry-scheduler bench --json`` as a script runs it: the report on stdout, the rest on stderr."""
    import subprocess
    import sys

    done = subprocess.run(
        [str(Path(sys.executable).parent / "retry-scheduler"), "--database-url", ADMIN_URL, "bench", "--quick",
         "--only", "claim", "--json", "--db-name", f"{DB_NAME}_cli", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["claim_cost_ratio_10m_vs_10k"] > 0 and report["quick"] is True
    assert report == json.loads((tmp_path / "report.json").read_text())
    assert "bench: 0/1 measurements" in done.stderr and "bench: 1/1 measurements" in done.stderr
    assert "claim_cost_ratio_10m_vs_10k" in done.stderr  # the table, for whoever watches


def test_a_run_removes_its_work_directory_and_a_failed_or_kept_run_keeps_it(bootstrap_servers: str) -> None:
    from bench.env import BenchEnv

    settings = Settings(database_url=ADMIN_URL)
    name = f"retry_bench_workdir_{uuid.uuid4().hex[:8]}"
    with BenchEnv(settings, name, bootstrap_servers) as env:
        (env.work_dir / "logs-capacity").mkdir()  # what a stack leaves there
        done = env.work_dir
    assert not done.exists()

    with (
        pytest.raises(RuntimeError, match="a measurement failed"),
        BenchEnv(settings, name, bootstrap_servers) as env,
    ):
        failed = env.work_dir
        raise RuntimeError("a measurement failed")
    assert failed.is_dir()  # its logs say why

    with BenchEnv(settings, name, bootstrap_servers, keep_db=True) as env:
        kept = env.work_dir
    assert kept.is_dir()
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
    for path in (failed, kept):
        shutil.rmtree(path)


def test_a_held_window_samples_slow_statements_and_lock_waits_and_keeps_a_missed_windows_logs(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    """What explains a stalled window: the statements running past a second and the sessions waiting
    for a lock, read from the server while they run; and the stack's logs, copied beside the report
    before the run's folder is removed."""
    import threading
    from types import SimpleNamespace

    from bench.env import BenchEnv
    from bench.held import _keep_logs, _slow_statements

    settings = Settings(database_url=ADMIN_URL)
    name = f"retry_bench_slow_{uuid.uuid4().hex[:8]}"
    with BenchEnv(settings, name, bootstrap_servers) as env:
        locked, waiting = threading.Event(), threading.Event()

        def hold_then_wait() -> None:
            with psycopg.connect(env.url, application_name="bench-holder") as holder:
                holder.execute("LOCK TABLE retry_destinations IN ACCESS EXCLUSIVE MODE")
                locked.set()
                with psycopg.connect(env.url, application_name="bench-waiter", autocommit=True) as waiter:
                    threading.Timer(3.0, holder.rollback).start()
                    waiting.set()
                    waiter.execute("SELECT count(*) FROM retry_destinations")

        thread = threading.Thread(target=hold_then_wait)
        thread.start()
        assert locked.wait(10) and waiting.wait(10)
        with psycopg.connect(env.url, application_name="bench-sleeper", autocommit=True) as sleeper:
            asleep = threading.Thread(target=sleeper.execute, args=("SELECT pg_sleep(3)",))
            asleep.start()
            deadline = time.monotonic() + 10
            rows = _slow_statements(env)
            while not {"bench-sleeper", "bench-waiter"} <= {row[0] for row in rows}:
                assert time.monotonic() < deadline, rows
                time.sleep(0.2)
                rows = _slow_statements(env)
            asleep.join()
        thread.join()
        apps = {row[0]: row for row in rows}
        waiter = apps["bench-waiter"]
        assert waiter[2] == "Lock:relation" and "retry_destinations" in waiter[4], rows
        # Idle in its transaction, holding its lock (as a publisher waiting for the broker would).
        assert apps["bench-holder"][1] == "idle in transaction" and "LOCK TABLE" in apps["bench-holder"][4]
        sleeping = apps["bench-sleeper"]
        assert sleeping[1] == "active" and sleeping[3] >= 1.0 and "pg_sleep" in sleeping[4], sleeping
        assert not [row for row in _slow_statements(env) if row[0].startswith("bench-")]  # once done

        stack_logs, airflow_home = env.work_dir / "logs-held", env.work_dir / "airflow-held"
        (airflow_home / "logs" / "dag_id=retry_scheduler").mkdir(parents=True)
        (airflow_home / "logs" / "dag_id=retry_scheduler" / "attempt=1.log").write_text("claimed 5 jobs\n")
        stack_logs.mkdir()
        (stack_logs / "scheduler.log").write_text("scheduler\n")
        stack = SimpleNamespace(log_dir=stack_logs, airflow_home=airflow_home)
        assert _keep_logs(env, stack, "held") is None  # no report folder: nothing copied
        env.report_dir = tmp_path
        kept = Path(_keep_logs(env, stack, "held") or "")
    assert kept == tmp_path / "logs-held"
    assert (kept / "stack" / "scheduler.log").read_text() == "scheduler\n"
    assert (kept / "airflow" / "dag_id=retry_scheduler" / "attempt=1.log").read_text() == "claimed 5 jobs\n"
