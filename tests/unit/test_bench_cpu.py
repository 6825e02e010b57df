"""How the benchmark reports the machine's CPU: busy, idle and stolen by the hypervisor, and the CPU seconds
each kind of process used (PostgreSQL, the Spark JVM, its Python workers, ...)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench.cpu import (
    ProcessCpu,
    cpu_shares,
    cpu_text,
    cpu_times,
    cpu_use_text,
    process_kind,
)

STAT = "cpu  {user} 0 {system} {idle} {iowait} 0 {softirq} {steal} 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1 2\n"


def _stat(tmp_path: Path, name: str, **ticks: int) -> dict[str, int] | None:
    path = tmp_path / name
    path.write_text(STAT.format(**ticks))
    return cpu_times(str(path))


def test_the_aggregate_line_is_read_by_kind(tmp_path: Path) -> None:
    times = _stat(tmp_path, "a", user=100, system=50, idle=400, iowait=10, softirq=5, steal=35)
    assert times == {
        "user": 100, "nice": 0, "system": 50, "idle": 400, "iowait": 10, "irq": 0, "softirq": 5, "steal": 35,
    }  # fmt: skip


def test_shares_between_two_readings(tmp_path: Path) -> None:
    before = _stat(tmp_path, "a", user=100, system=50, idle=400, iowait=10, softirq=5, steal=35)
    # 1 000 ticks later: 600 of work (user, system, softirq), 150 idle or waiting for I/O, 250 stolen.
    after = _stat(tmp_path, "b", user=600, system=140, idle=540, iowait=20, softirq=15, steal=285)
    shares = cpu_shares(before, after)
    assert shares == {"busy_pct": 60.0, "idle_pct": 15.0, "steal_pct": 25.0}
    assert cpu_text(shares) == "60 % busy, 15 % idle, 25 % stolen by the hypervisor"


def test_unknown_without_proc_stat_or_elapsed_time(tmp_path: Path) -> None:
    assert cpu_times(str(tmp_path / "missing")) is None
    (tmp_path / "other").write_text("intr 1 2\n")
    assert cpu_times(str(tmp_path / "other")) is None
    same = _stat(tmp_path, "a", user=1, system=1, idle=1, iowait=0, softirq=0, steal=0)
    assert cpu_shares(same, same) is None
    assert cpu_shares(None, same) is None
    assert cpu_text(None) is None


def test_this_machine_has_a_reading() -> None:
    # The benchmark runs on Linux: the real /proc/stat is readable and its shares add up to 100 %.
    before = cpu_times()
    assert before is not None and before["idle"] > 0
    deadline = time.monotonic() + 5
    while (shares := cpu_shares(before, cpu_times())) is None and time.monotonic() < deadline:
        sum(i * i for i in range(50_000))  # until a clock tick has passed
    assert shares is not None
    assert abs(sum(shares.values()) - 100) <= 0.2


def test_processes_are_told_apart_by_name_and_command_line() -> None:
    assert process_kind(os.getpid(), "python3", "") == "benchmark"
    backend = "postgres: 15/main: postgres retry_bench 127.0.0.1(5) COPY"
    assert process_kind(1, "postgres", backend) == "PostgreSQL: service"
    backend = "postgres: 15/main: postgres retry_bench_capacity_airflow 127.0.0.1(5) idle"
    assert process_kind(1, "postgres", backend) == "PostgreSQL: Airflow's metadata"
    # a cluster without a cluster_name (the dev tooling's own): no "15/main:" in the title
    assert (
        process_kind(1, "postgres", "postgres: postgres retry_bench 127.0.0.1(5) COPY")
        == "PostgreSQL: service"
    )
    assert process_kind(1, "postgres", "postgres: 15/main: checkpointer ") == "PostgreSQL: server"
    assert process_kind(1, "postgres", "/usr/lib/postgresql/15/bin/postgres -D /x") == "PostgreSQL: server"
    assert process_kind(1, "java", "java -cp ... org.apache.spark.deploy.SparkSubmit") == "Spark JVM"
    kafka = "java -Xmx1g -cp /c/kafka-4.4.0/* kafka.Kafka /t/kafka/server.properties"
    assert process_kind(1, "java", kafka) == "broker"
    assert process_kind(1, "python3", "/venv/bin/python -m pyspark.daemon") == "Spark Python workers"
    assert process_kind(1, "python3", "/venv/bin/python /repo/include/spark/bulk_retry.py --x") == (
        "Spark Python driver"
    )
    assert process_kind(1, "python3", "/venv/bin/python -c 'ingest worker'") == "other"
    assert process_kind(1, "bash", "bash") == "other"


def test_airflow_s_processes_are_told_apart_by_their_titles() -> None:
    # The titles Airflow 3.3 sets (setproctitle), and the ones the loops add to their task's.
    ti = "0199c5d2-8e3b-7f0a-9a6b-0c1d2e3f4a5b"
    kinds = {
        "/venv/bin/python3 /venv/bin/airflow scheduler": "airflow scheduler",
        "/venv/bin/python3 /venv/bin/airflow dag-processor": "airflow dag-processor",
        "/venv/bin/python3 /venv/bin/airflow triggerer": "airflow triggerer",
        "airflow api_server -- host:127.0.0.1 port:8080": "airflow api-server",
        "airflow serve-logs": "airflow serve-logs",
        "airflow worker -- LocalExecutor: <idle>": "airflow executor",
        f"airflow worker -- LocalExecutor: {ti}": "task supervisors",
        f"airflow task supervisor: ['airflow', 'tasks', 'run', '{ti}']": "task supervisors",
        f"airflow worker -- {ti}": "other tasks",
        f"airflow worker -- {ti} retry-scheduler ingest loop": "ingest task",
        f"airflow worker -- {ti} retry-scheduler publish loop": "publish task",
        "/venv/bin/python -c from retry_scheduler.loops.ingest_process import worker_main; worker_main()": "ingest workers",
    }
    for cmdline, kind in kinds.items():
        comm = "python3" if cmdline.startswith("/venv") else cmdline[:15]
        assert process_kind(1, comm, cmdline) == kind, cmdline


def test_cpu_of_a_busy_child_process_is_counted_for_its_kind() -> None:
    # A real child process spinning for a second, started and ended inside the window.
    with ProcessCpu(interval_s=0.05) as cpu:
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import time\nend = time.process_time() + 1\nwhile time.process_time() < end: pass",
            ],
            check=True,
        )
    used = cpu.seconds()
    assert used["other"] >= 0.8, used  # its CPU second, less at most one sampling interval


@pytest.mark.serial  # it measures the machine's CPU shares: other tests running beside it count as 'other'
def test_children_that_end_between_samples_count_through_their_parent() -> None:
    # Like PostgreSQL's short-lived backends: never sampled, reaped by their parent (here this process).
    spin = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    with ProcessCpu(interval_s=60) as cpu:  # no sample between the first and the last
        for _ in range(8):
            subprocess.run([sys.executable, "-c", spin], check=True)
    used = cpu.seconds()
    children_s = 8 * 0.3
    assert used["benchmark"] >= children_s, used
    # Never seen alive: counted once, for the parent, not again as "other". "other" also holds what
    # the machine's own processes used meanwhile (a service, a JVM still ending after an earlier test:
    # 0.5 s was seen), so the bound is the children's time, which counting them twice would pass.
    assert used.get("other", 0) < children_s, used


def test_a_child_running_before_the_window_counts_only_what_it_used_inside_it() -> None:
    # Like a task process that ran for a minute and ends during a capacity step: its parent reaps it,
    # and the minute before the step is not the parent's CPU in the step.
    spin = (
        "import sys, time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"
        "print('spun', flush=True)\nsys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline() == "spun\n"
    with ProcessCpu(interval_s=60) as cpu:  # sampled at the start and at the end only
        child.stdin.close()
        assert child.wait(30) == 0
    used = cpu.seconds()
    assert used.get("benchmark", 0) < 0.3, used  # the parent (this process): its 0.6 s before the window


def test_an_orphan_counts_once_when_its_new_parent_reaps_it(tmp_path: Path) -> None:
    # As an Airflow task process is: its parent exits, a subreaper (or init) adopts it, and the
    # adopter's count of reaped children then holds the CPU the orphan used, already counted while it
    # was seen. Here the measuring process is the subreaper (Linux's PR_SET_CHILD_SUBREAPER), so
    # that the reaping happens while it measures.
    script = tmp_path / "measure.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import ctypes, json, os, subprocess, sys, time
            sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
            from bench.cpu import ProcessCpu
            assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
            orphan = (
                "import os, sys, time\\n"
                "if os.fork():\\n    time.sleep(0.3)\\n    sys.exit(0)\\n"  # seen with its parent, then orphaned
                "time.sleep(0.6)\\nend = time.process_time() + 1.0\\n"
                "while time.process_time() < end: pass\\n"
            )
            with ProcessCpu(interval_s=0.05) as cpu:
                subprocess.run([sys.executable, "-c", orphan], check=True)
                os.waitpid(-1, 0)  # the orphan, adopted by this process
                time.sleep(0.2)
            print(json.dumps(cpu.seconds()))
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    used = json.loads(done.stdout.strip().splitlines()[-1])
    assert used.get("other", 0) >= 0.8, used  # the orphan's second, while it was seen
    assert used.get("benchmark", 0) < 0.5, used  # and not once more for the process that reaped it


def test_a_process_counts_as_the_program_it_execs(tmp_path: Path) -> None:
    # As spark-submit, a shell script, execs the JVM: the same process, then named "java".
    java = tmp_path / "java"
    java.symlink_to(sys.executable)
    spin = "import time\nend = time.process_time() + 1\nwhile time.process_time() < end: pass"
    with ProcessCpu(interval_s=0.05) as cpu:
        subprocess.run(["sh", "-c", f'sleep 0.2; exec "{java}" -c "$0"', spin], check=True)
    assert cpu.seconds()["Spark JVM"] >= 0.8, cpu.seconds()


def test_a_process_that_changes_its_title_counts_as_each_in_turn(tmp_path: Path) -> None:
    # As an executor worker turns supervisor and back: the CPU of each stretch goes to its kind.
    body = (
        "import time, setproctitle\n"
        "def spin(s):\n"
        "    end = time.process_time() + s\n"
        "    while time.process_time() < end: pass\n"
        "setproctitle.setproctitle('airflow worker -- LocalExecutor: <idle>'); spin(0.6)\n"
        "setproctitle.setproctitle('airflow worker -- x retry-scheduler publish loop'); spin(0.6)\n"
    )
    with ProcessCpu(interval_s=0.05) as cpu:
        subprocess.run([sys.executable, "-c", body], check=True)
    used = cpu.seconds()
    assert used["airflow executor"] >= 0.45 and used["publish task"] >= 0.45, used


def test_cpu_use_against_the_cores() -> None:
    text = cpu_use_text({"PostgreSQL": 9.1, "Spark JVM": 5.2}, 12.0, 2)
    assert text == "PostgreSQL 9.1, Spark JVM 5.2: 14.3 CPU seconds in 12.0 s of the 24.0 that 2 cores have"


def test_the_sampling_thread_s_own_cpu_is_not_the_benchmark_s() -> None:
    # Sampling every millisecond keeps the sampling thread busy for most of the second; the benchmark's
    # process itself only sleeps meanwhile. A part measured alone in the benchmark's process (the
    # publish loop) must not be charged for the sampler, or it looks dearer than it is.
    began = time.process_time()
    with ProcessCpu(interval_s=0.001) as cpu:
        time.sleep(1.0)
    process_s = time.process_time() - began
    assert process_s >= 0.2, process_s  # the sampler did work, in this very process
    assert cpu.seconds().get("benchmark", 0.0) <= 0.1 * process_s, (cpu.seconds(), process_s)
