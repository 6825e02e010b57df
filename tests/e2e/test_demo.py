"""``make demo`` in miniature: the dev stack, the real Airflow scheduler, a mixed workload."""

from __future__ import annotations

import io
import json
import logging

import pytest

from retry_scheduler.core.config import Settings
from retry_scheduler.dev.demo import run_demo
from retry_scheduler.dev.procs import free_port
from tests.conftest import checkout_database

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


def test_demo_under_the_real_scheduler(database_url: str, tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="retry_scheduler.dev")
    settings = Settings(database_url=database_url, kafka={"bootstrap.servers": f"127.0.0.1:{free_port()}"})
    lines: list[str] = []
    summary = io.StringIO()  # what `demo --json` prints on stdout
    code = run_demo(
        settings,
        records=40,
        timeout_s=240,
        say=lines.append,
        json_out=summary,
        api_port=free_port(),
        metadata_db=checkout_database("retry_airflow_e2e_"),
        airflow_home=tmp_path / "airflow",
    )
    text = "\n".join(lines)
    assert code == 0, text
    assert "result: OK, every record reached its expected outcome" in text
    assert "recovered by the app              20   (expected 20)" in text
    assert "dead: exhausted                   12   (expected 12)" in text
    assert "dead: invalid                      4   (expected 4)" in text
    assert "early: 0" in text
    result = json.loads(summary.getvalue())
    assert (result["ok"], result["recovered"], result["early"]) == (True, 20, 0)
    assert result["dead"] == result["expected"]["dead"] and result["dead"]["exhausted"] == 12
    assert result["lateness_s"]["p99"] is not None and result["lateness_s"]["p99"] >= 0
    # The stack ended the DAG's running loops (SIGTERM) before its scheduler: no task was left running
    # when it stopped the services, so the scheduler had none to wait for. (Whether the scheduler then
    # exits within 60 s is Airflow's: its LocalExecutor's end() joins its worker processes without a
    # bound, apache/airflow#67870, and a fresh-clone CI run saw it hang with every workload finished;
    # the stack then kills it, as it says.)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "task process(es) still running" in m], messages
    assert any(m.startswith("stopping scheduler") for m in messages), messages  # stopped, after its tasks
