"""The suite's own teardown: a process a test leaves running fails the run and is stopped, whether the
tests run in one process or side by side in pytest-xdist workers (whose own exit status the controller
ignores). Each case runs a small pytest session with this suite's conftest as a plugin."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT

LEAKY = """
import subprocess, sys

def test_leaves_a_process_running():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)  # {token}"])

def test_stops_what_it_starts():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    proc.kill()
    proc.wait()
"""


def _session(
    tmp_path: Path, *args: str, strict: str | None = None
) -> tuple[subprocess.CompletedProcess[str], str]:
    token = uuid.uuid4().hex
    (tmp_path / "test_leaky.py").write_text(LEAKY.format(token=token))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RETRY_TEST_STRICT"))}
    env["PYTHONPATH"] = str(ROOT)
    env["RETRY_TEST_PROCESS_GRACE_S"] = "1"  # nothing here is stopping by itself
    if strict is not None:
        env["RETRY_TEST_STRICT_PROCESSES"] = strict
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", *args, "."],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return done, token


def _running(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one-process", "xdist"])
def test_a_process_left_running_fails_the_run_and_is_stopped(
    tmp_path: Path, workers: tuple[str, ...]
) -> None:
    done, token = _session(tmp_path, *workers)

    assert "2 passed" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 1, done.stdout + done.stderr
    assert "processes the tests left running (stopped now)" in done.stderr, done.stderr
    assert token in done.stderr  # the listing names the process by its command line
    assert _running(token) == []


def test_strict_off_lists_the_process_and_passes(tmp_path: Path) -> None:
    done, token = _session(tmp_path, strict="0")

    assert done.returncode == 0, done.stdout + done.stderr
    assert token in done.stderr
    assert _running(token) == []
