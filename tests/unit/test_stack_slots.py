"""The tests' limit of dev stacks at once: real processes holding real lock files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import stack_slots

ROOT = Path(__file__).resolve().parents[2]
HOLDER = (
    "import sys; from tests import stack_slots as s; h = s.acquire(2, 'holder ' + sys.argv[1]); "
    "print('got', flush=True); sys.stdin.read()"
)


def test_slots_fit_the_server_and_the_setting_wins() -> None:
    assert stack_slots.slot_count(100) == 3
    assert stack_slots.slot_count(20) == 1
    assert stack_slots.slot_count(400) == 13
    assert stack_slots.slot_count(100, "1") == 1
    assert stack_slots.slot_count(100, "0") == 1


def test_a_stack_waits_for_a_slot_and_gets_the_one_a_killed_holder_had(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack_slots, "SLOTS_DIR", tmp_path)
    env = {**os.environ, "RETRY_TEST_STACK_SLOTS_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(n)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(2)
    ]
    try:
        for holder in holders:
            assert holder.stdout is not None and holder.stdout.readline() == "got\n"
        with pytest.raises(TimeoutError, match=r"no dev stack slot of 2 was free for 0 s") as refused:
            stack_slots.acquire(2, "third", wait_s=0.5)
        assert "holder 0" in str(refused.value) and "holder 1" in str(refused.value)
        holders[0].send_signal(signal.SIGKILL)
        holders[0].wait()
        third = stack_slots.acquire(2, "third", wait_s=10)
        assert f"{os.getpid()} third\n" in {p.read_text() for p in tmp_path.glob("slot-*")}
        with pytest.raises(TimeoutError):
            stack_slots.acquire(2, "fourth", wait_s=0.5)
        stack_slots.release(third)
        stack_slots.release(third)  # twice: nothing
        stack_slots.release(stack_slots.acquire(2, "fourth", wait_s=1))
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
