"""``make test`` ends with its summary: what is logged at interpreter exit below WARNING is not printed.

Run as a user runs it: pytest in a subprocess with this suite's conftest, on a test that configures
logging as importing Airflow does and logs at exit as py4j's finaliser does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

EXIT_LOGGING_TEST = """
import atexit
import logging
import sys


def test_logging_configured_like_airflow():
    root = logging.getLogger()
    root.addHandler(logging.StreamHandler(sys.stderr))  # pytest's captured stderr, closed at exit
    root.setLevel(logging.INFO)
    atexit.register(logging.warning, "a warning at exit")
    atexit.register(logging.info, "an info at exit", exc_info=ValueError("connection reset"))
"""


def test_info_logged_at_exit_is_dropped_and_warnings_still_show(tmp_path: Path) -> None:
    test_file = tmp_path / "test_exit_logging.py"
    test_file.write_text(EXIT_LOGGING_TEST)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
         "-p", "tests.conftest", str(test_file)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "1 passed" in run.stdout
    assert "a warning at exit" in run.stderr
    assert "an info at exit" not in output
    assert "Logging error" not in output
    assert "Traceback" not in output
