"""The dev tooling's REST client keeps polling when a busy api-server answers one request too late."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator

import pytest

from retry_scheduler.dev import airflow_api


class _SlowOnce(http.server.BaseHTTPRequestHandler):
    """Answers a DAG run's GET: the first too late, then ``running`` once, then ``success``."""

    calls = 0

    def do_GET(self) -> None:
        type(self).calls += 1
        if self.calls == 1:
            time.sleep(1.0)  # past the client's timeout
        state = "running" if self.calls <= 2 else "success"
        body = json.dumps({"dag_run_id": "r1", "state": state}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped waiting for this one

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def slow_server() -> Iterator[str]:
    _SlowOnce.calls = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowOnce)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_late_answer_is_asked_again_until_the_deadline(
    slow_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(airflow_api, "API_TIMEOUT_S", 0.3)
    run = airflow_api.wait_for_dag_run(slow_server, "token", "d", "r1", timeout=30)
    assert run["state"] == "success" and _SlowOnce.calls == 3


def test_one_request_that_times_out_says_so(slow_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(airflow_api, "API_TIMEOUT_S", 0.3)
    with pytest.raises(airflow_api.ApiTimeout, match=r"no answer within 0\.3 s"):
        airflow_api.dag_runs(slow_server, "token", "d")
