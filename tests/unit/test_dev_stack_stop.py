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
