"""Stopping a dev stack ends its running tasks before its services, with real processes: a stand-in
scheduler whose task runs in a process group of its own, as Airflow's executors start them."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from retry_scheduler.core.config import Settings
from retry_scheduler.dev.stack import DevStack

TASK = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # still starting up: no handler of the loop's yet
print("starting", flush=True)
time.sleep(1.5)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the loop's: it ends after the work in hand
time.sleep(120)
"""
SCHEDULER = f"""
import subprocess, sys, time
task = subprocess.Popen([sys.executable, "-c", {TASK!r}], start_new_session=True)
print(task.pid, flush=True)
task.wait()
time.sleep(120)
"""


def test_a_task_that_missed_the_first_sigterm_is_sent_another_before_the_services_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="retry_scheduler.dev")
    scheduler = subprocess.Popen(
        [sys.executable, "-c", SCHEDULER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert scheduler.stdout is not None
    lines = {scheduler.stdout.readline().strip() for _ in range(2)}  # the task's pid, and its "starting"
    task = psutil.Process(int(next(line for line in lines if line.isdigit())))
    stack = DevStack(Settings(database_url="postgresql://127.0.0.1:1/unused"), say=lambda _m: None)
    stack._procs = [("scheduler", scheduler)]  # as start() adopts them
    began = time.monotonic()
    try:
        stack.stop()
    finally:
        for pid in (task.pid, scheduler.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    said = [r.getMessage() for r in caplog.records]
    assert not task.is_running() and scheduler.poll() is not None
    # the task ended on a second SIGTERM, before its scheduler was stopped; nothing had to wait 30 s
    assert not any("still running" in line for line in said), said
    assert said == [f"stopping scheduler (pid {scheduler.pid})"]
    assert time.monotonic() - began < 25  # (30 s is the wait for tasks: this tells the two paths apart)


SERVICE = """
import signal, sys, time
def stop(*_):
    print("term", time.time(), flush=True)
    time.sleep(1.0)  # its own shutdown
    print("end", time.time(), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("up", flush=True)
time.sleep(120)
"""


def test_the_services_stop_a_tier_at_a_time_each_tier_together(tmp_path) -> None:
    # As start() adopts them: the broker, the api-server, the scheduler, dag processor and triggerer.
    names = ["broker", "api-server", "scheduler", "dag-processor", "triggerer"]
    procs, logs = [], {}
    for name in names:
        logs[name] = tmp_path / f"{name}.log"
        with logs[name].open("w") as out:
            proc = subprocess.Popen([sys.executable, "-c", SERVICE], stdout=out, start_new_session=True)
        procs.append((name, proc))
    deadline = time.monotonic() + 30
    while not all(path.read_text().startswith("up") for path in logs.values()):
        assert time.monotonic() < deadline, "the stand-in services did not start"
        time.sleep(0.05)
    stack = DevStack(Settings(database_url="postgresql://127.0.0.1:1/unused"), say=lambda _m: None)
    stack._procs = list(procs)
    try:
        stack.stop()
    finally:
        for _name, proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert all(proc.poll() == 0 for _name, proc in procs)  # each ended by its own SIGTERM handler
    when = {
        name: dict(
            (word, float(at))
            for word, at in (line.split() for line in path.read_text().split("\n")[1:] if line)
        )
        for name, path in logs.items()
    }
    tier = ("scheduler", "dag-processor", "triggerer")
    # The three were asked together: each before any of them had ended.
    assert max(when[n]["term"] for n in tier) < min(when[n]["end"] for n in tier), when
    # Then the api-server, once they had all ended; then the broker, once the api-server had.
    assert when["api-server"]["term"] >= max(when[n]["end"] for n in tier), when
    assert when["broker"]["term"] >= when["api-server"]["end"], when


LOSES_FIRST_SIGTERM = """
import signal, sys, time
def first(*_):  # as Airflow's handler's SystemExit is lost inside a garbage collector's callback
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
signal.signal(signal.SIGTERM, first)
print("ready", flush=True)
while True:
    time.sleep(0.1)
"""


def test_a_service_that_lost_its_sigterm_is_sent_another_before_sigkill(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from retry_scheduler.dev.procs import terminate_all

    caplog.set_level(logging.INFO, logger="retry_scheduler.dev")
    service = subprocess.Popen(
        [sys.executable, "-c", LOSES_FIRST_SIGTERM], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert service.stdout is not None and service.stdout.readline().strip() == "ready"

    terminate_all([("scheduler", service, 30.0)], resignal_s=1.0)

    assert service.returncode == 0  # its own exit on the second SIGTERM, not SIGKILL's -9
    said = [r.getMessage() for r in caplog.records]
    assert "scheduler still running 1 s after SIGTERM: sending it again" in said
    assert not any("SIGKILL" in line for line in said), said
