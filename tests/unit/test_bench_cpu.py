"""How the benchmark reports the machine's CPU: busy, idle and stolen by the hypervisor."""

from __future__ import annotations

import time
from pathlib import Path

from retry_scheduler.bench_report import cpu_shares, cpu_text, cpu_times

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
