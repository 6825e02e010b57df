"""A local-mode Spark job yields the CPU to the retry loops: its processes run at ``RETRY_SPARK_LOCAL_NICE``.

Run for real: ``run_spark_submit`` starts spark-submit (a JVM, then the job's Python driver) on a tiny
job that prints its own niceness, as the bulk retry prints its result.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from retry_scheduler.spark.executor_env import LOCAL_NICE_ENV, local_nice, niced_if_local
from retry_scheduler.spark.submit import run_spark_submit

JOB = """
import json, os
print(json.dumps({"nice": os.nice(0)}), flush=True)
"""


def _job_niceness(tmp_path: Path, master: str) -> int:
    app = tmp_path / "niceness.py"
    app.write_text(JOB)
    shown: list[dict[str, Any]] = []
    code = run_spark_submit(app, [], master=master, conf={}, show=shown.append)
    assert code == 0 and shown, (code, shown)
    return int(shown[0]["nice"])


@pytest.mark.parametrize(("setting", "expected"), [(None, 10), ("3", 3), ("0", 0)])
def test_a_local_job_runs_at_the_configured_niceness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str | None, expected: int
) -> None:
    if setting is None:
        monkeypatch.delenv(LOCAL_NICE_ENV, raising=False)
    else:
        monkeypatch.setenv(LOCAL_NICE_ENV, setting)
    own = os.nice(0)
    assert _job_niceness(tmp_path, "local[1]") == min(19, own + expected)


def test_a_cluster_submission_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LOCAL_NICE_ENV, raising=False)
    argv = ["spark-submit", "job.py"]
    assert niced_if_local("spark://master:7077", argv) == argv
    assert niced_if_local("local[*]", argv)[-2:] == argv and "-n" in niced_if_local("local[*]", argv)


@pytest.mark.parametrize("bad", ["high", "-5", "20", "1.5"])
def test_a_bad_niceness_says_what_to_give(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv(LOCAL_NICE_ENV, bad)
    with pytest.raises(ValueError, match="give a niceness from 0 to 19"):
        local_nice()
