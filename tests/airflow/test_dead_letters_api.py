"""The Dead letters JSON API, served by a real ``airflow api-server`` with Airflow's own auth.

One api-server per module (SimpleAuthManager, users admin/admin and viewer/viewer) on the
migrated Airflow test database; the plugin reads the retry database from the ``retry_postgres``
connection (``RETRY_DATABASE_URL`` deliberately points nowhere). Tests isolate themselves by
giving their dead jobs a destination of their own.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from retry_scheduler.core.config import Settings
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.jobs import encode_headers
from retry_scheduler.db.schema import migrate
from retry_scheduler.dev.airflow_api import api_token
from retry_scheduler.dev.airflow_env import airflow_bin, airflow_env
from retry_scheduler.dev.procs import Proc, free_port, spawn, tail, terminate
from tests.airflow.conftest import AIRFLOW_DB
from tests.conftest import ROOT, _db_url, _scratch_database

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

USERS = {"admin": "admin", "viewer": "viewer"}
ROLES = "admin:admin,viewer:viewer"
PREFIX = "/retry-scheduler"


@dataclass
class AirflowServer:
    base_url: str
    proc: Proc
    log_path: Path
    env: dict[str, str]

    def url(self, path: str) -> str:
        return f"{self.base_url}{PREFIX}{path}"

    def log_tail(self) -> str:
        return tail(self.log_path, 60)


@pytest.fixture(scope="module")
def retry_db() -> Iterator[str]:
    """A migrated retry database for the module's api-server, dropped afterwards."""
    with _scratch_database(f"retry_webui_{uuid.uuid4().hex[:10]}") as url:
        migrate(url)
        yield url


@pytest.fixture(scope="module")
def airflow_server(
    airflow_db: Path, retry_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AirflowServer]:
    """``airflow api-server`` configured like ``make up`` (the plugin loaded by its entry point)."""
    port = free_port()
    home = tmp_path_factory.mktemp("airflow-webui")
    env = airflow_env(Settings(database_url=retry_db), home, ROOT / "dags", port, metadata_db=AIRFLOW_DB)
    env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] = ROLES
    (home / "simple_auth_manager_passwords.json").write_text(json.dumps(USERS))
    # The plugin must find the database through the retry_postgres connection, not this.
    env["RETRY_DATABASE_URL"] = _db_url("retry_webui_no_such_database")
    env["RETRY_ADOPT_TOPICS"] = "webui.work.dlq=share,webui.clicks.dlq=streams:retry"
    assert env["AIRFLOW_CONN_RETRY_POSTGRES"].endswith(retry_db.rpartition("/")[2])
    log_path = home / "api-server.log"
    proc = spawn([airflow_bin(), "api-server", "--port", str(port)], log_path, env)
    server = AirflowServer(f"http://localhost:{port}", proc, log_path, env)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, f"api-server exited:\n{server.log_tail()}"
            try:
                if httpx.get(f"{server.base_url}/api/v2/monitor/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"api-server not up after 180 s:\n{server.log_tail()}"
            time.sleep(0.5)
        # An import error in the plugin would only show as a missing page: fail with the error instead.
        auth = {"Authorization": f"Bearer {api_token(server.base_url)}"}
        errors = httpx.get(f"{server.base_url}/api/v2/plugins/importErrors", headers=auth).json()
        assert errors["total_entries"] == 0, errors
        plugins = httpx.get(f"{server.base_url}/api/v2/plugins", headers=auth).json()["plugins"]
        assert "retry_scheduler" in {p["name"] for p in plugins}, plugins
        yield server
    finally:
        terminate(proc, "api-server", timeout=15)


@pytest.fixture(scope="module")
def tokens(airflow_server: AirflowServer) -> dict[str, str]:
    return {user: api_token(airflow_server.base_url, user, password) for user, password in USERS.items()}


@pytest.fixture
def dest() -> str:
    """A destination topic of this test's own: filtering on it isolates the test's dead jobs."""
    return f"t{uuid.uuid4().hex[:8]}-orders"


def insert_dead(database_url: str, destination: str | None, **fields: Any) -> int:
    """Store one dead job (defaults for everything not given); returns its id."""
    now = datetime.now(UTC)
    row: dict[str, Any] = {
        "source_topic": "retry",
        "source_partition": 0,
        "source_offset": uuid.uuid4().int % 2**62,
        "source_timestamp_ms": int(now.timestamp() * 1000),
        "destination": destination,
        "msg_key": b"key",
        "msg_value": b"value",
        "headers": encode_headers([("trace-id", b"abc")]),
        "attempt": 3,
        "policy": "default",
        "reason": "TimeoutError: broker did not answer",
        "error_class": "TimeoutError",
        "retry_id": uuid.uuid4().hex,
        "first_seen_at": now - timedelta(hours=1),
        "due_at": now - timedelta(minutes=5),
        "status": "dead",
        "dead_reason": "exhausted",
        "dlq_topic": "retry.dlq",
        "dead_at": now - timedelta(minutes=1),
        "dlq_published_at": now,
    }
    row.update(fields)
    if isinstance(row["headers"], list):
        row["headers"] = encode_headers(row["headers"])
    insert = sql.SQL("INSERT INTO retry_jobs ({}) VALUES ({}) RETURNING id").format(
        sql.SQL(", ").join(map(sql.Identifier, row)), sql.SQL(", ").join(map(sql.Placeholder, row))
    )
    with psycopg.connect(database_url) as conn:
        got = conn.execute(insert, row).fetchone()
    assert got is not None
    return int(got[0])


def copies(database_url: str, job_id: int, count: int) -> None:
    """Store ``count`` more jobs like job ``job_id`` (its next source offsets, their own retry ids),
    with the ids right after the ones taken so far."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO retry_jobs (source_topic, source_partition, source_offset, source_timestamp_ms,"
            " destination, msg_key, msg_value, headers, attempt, policy, reason, error_class, retry_id,"
            " first_seen_at, due_at, status, dead_reason, dlq_topic, dead_at, dlq_published_at)"
            " SELECT source_topic, source_partition, source_offset + g, source_timestamp_ms, destination,"
            " msg_key, msg_value, headers, attempt, policy, reason, error_class, md5(g::text || retry_id),"
            " first_seen_at, due_at, status, dead_reason, dlq_topic, dead_at, dlq_published_at"
            " FROM retry_jobs, generate_series(1, %s) AS g WHERE id = %s",
            (count, job_id),
        )


def job_rows(database_url: str, ids: list[int]) -> dict[int, dict[str, Any]]:
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        rows = conn.execute("SELECT * FROM retry_jobs_all WHERE id = ANY(%s)", (ids,)).fetchall()
    return {r["id"]: r for r in rows}


def audit_row(database_url: str, audit_id: int) -> dict[str, Any]:
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        row = conn.execute("SELECT * FROM retry_dlq_audit WHERE id = %s", (audit_id,)).fetchone()
    assert row is not None, f"no audit row {audit_id}"
    return row


def audit_count(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        got = conn.execute("SELECT count(*) FROM retry_dlq_audit").fetchone()
    return int(got[0]) if got else 0


def client(server: AirflowServer, token: str | None = None, **kwargs: Any) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=f"{server.base_url}{PREFIX}", headers=headers, timeout=60, **kwargs)


# --- authentication and authorization --------------------------------------------------------------


def test_without_a_login_the_page_redirects_and_the_api_refuses(airflow_server: AirflowServer) -> None:
    with client(airflow_server) as anonymous:
        page = anonymous.get("/")
        assert page.status_code == 307
        location = httpx.URL(page.headers["location"])
        assert location.path == "/auth/login"
        assert location.params["next"] == airflow_server.url("/")

        for path in (
            "/api/me",
            "/api/dead-letters",
            "/api/dead-letters/1",
            "/api/facets",
            "/api/audit",
            "/api/openapi.json",
        ):
            response = anonymous.get(path)
            assert response.status_code == 401, path
            assert response.json() == {"detail": "Not authenticated"}
        assert anonymous.get("/static/app.js").status_code == 401
        assert anonymous.post("/api/replay", json={"ids": [1], "dry_run": False}).status_code == 401
        assert anonymous.post("/api/purge", json={"ids": [1], "dry_run": False}).status_code == 401

    # A forged or stale token is no login either: the page sends it to the login page again.
    with client(airflow_server, cookies={"_token": "not-a-jwt"}) as forged:
        assert forged.get("/").status_code == 307
        assert forged.get("/api/dead-letters").status_code == 403


def test_the_airflow_ui_cookie_logs_in_page_and_api(
    airflow_server: AirflowServer, tokens: dict[str, str]
) -> None:
    with client(airflow_server, cookies={"_token": tokens["admin"]}) as browser:
        page = browser.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "Dead letters" in page.text
        # Data reaches the page only through the API and script files of this app.
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert browser.get("/static/app.js").status_code == 200
        assert browser.get("/static/index.html").status_code == 404  # only the listed files
        me = browser.get("/api/me").json()
        paths = browser.get("/api/openapi.json").json()["paths"]
    assert {"/api/dead-letters", "/api/dead-letters/{job_id}", "/api/replay", "/api/purge"} <= set(paths)
    assert me["user"] == "admin" and me["can_operate"] is True and me["dag_id"] == "dlq_replay"


def test_a_viewer_reads_but_may_not_replay_or_purge(
    airflow_server: AirflowServer, tokens: dict[str, str], retry_db: str, dest: str
) -> None:
    job = insert_dead(retry_db, dest)
    audits = audit_count(retry_db)
    with client(airflow_server, tokens["viewer"]) as viewer:
        me = viewer.get("/api/me").json()
        assert me == {**me, "user": "viewer", "can_operate": False}
        listed = viewer.get("/api/dead-letters", params={"destination": dest}).json()
        assert [j["id"] for j in listed["jobs"]] == [job]
        assert viewer.get(f"/api/dead-letters/{job}").json()["status"] == "dead"
        for action in ("replay", "purge", "reevaluate"):
            for dry_run in (True, False):
                refused = viewer.post(f"/api/{action}", json={"ids": [job], "dry_run": dry_run})
                assert refused.status_code == 403, refused.text
    assert job_rows(retry_db, [job])[job]["status"] == "dead"
    assert audit_count(retry_db) == audits  # not even a dry run was recorded


def test_state_changes_must_be_json_from_this_site(
    airflow_server: AirflowServer, tokens: dict[str, str], retry_db: str, dest: str
) -> None:
    job = insert_dead(retry_db, dest)
    audits = audit_count(retry_db)
    body = json.dumps({"ids": [job], "dry_run": False})
    with client(airflow_server, cookies={"_token": tokens["admin"]}) as browser:
        # What a cross-site HTML form can send: refused before anything is read.
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
            refused = browser.post("/api/replay", content=body, headers={"Content-Type": content_type})
            assert refused.status_code == 415, (content_type, refused.text)
        assert browser.post("/api/purge", content=body).status_code == 415  # no content type at all
        cross_site = browser.post(
            "/api/purge", json={"ids": [job], "dry_run": False}, headers={"Sec-Fetch-Site": "cross-site"}
        )
        assert cross_site.status_code == 403
        assert browser.get("/api/replay").status_code == 405
        # A typo must not turn into a real replay (dry_run defaults to true, unknown fields fail).
        typo = browser.post("/api/replay", json={"ids": [job], "dryrun": False})
        assert typo.status_code == 422
        assert browser.post("/api/replay", json={"ids": [job]}).json()["dry_run"] is True
        # Bounded: no limit or id list a request could not finish.
        assert browser.post("/api/replay", json={"ids": [job], "limit": 10**12}).status_code == 422
        assert browser.post("/api/purge", json={"ids": list(range(1, 10_002))}).status_code == 422
    assert job_rows(retry_db, [job])[job]["status"] == "dead"
    assert audit_count(retry_db) == audits + 1  # the one dry run


# --- replay and purge --------------------------------------------------------------------------------


def test_admin_dry_runs_then_replays_with_an_audit_trail(
    airflow_server: AirflowServer, tokens: dict[str, str], retry_db: str, dest: str
) -> None:
    kept = insert_dead(retry_db, dest, attempt=4)
    reset = insert_dead(retry_db, dest, attempt=2)
    invalid = insert_dead(retry_db, dest, dead_reason="invalid", reason="bad retry.attempt header")
    with client(airflow_server, tokens["admin"]) as admin:
        dry = admin.post("/api/replay", json={"destination": dest, "dry_run": True}).json()
        assert (dry["dry_run"], dry["matched"], dry["would_affect"], dry["affected"]) == (True, 3, 2, 0)
        assert dry["skipped"]["invalid, no usable destination"] == 1
        assert dry["summary"].startswith("dry run: 2 of 3 selected dead jobs would be replayed")
        assert {r["status"] for r in job_rows(retry_db, [kept, reset]).values()} == {"dead"}
        dry_audit = audit_row(retry_db, dry["audit_id"])
        assert (dry_audit["actor"], dry_audit["source"], dry_audit["dry_run"]) == ("admin", "ui", True)
        assert dry_audit["filter"] == {"destination": dest}

        one = admin.post("/api/replay", json={"ids": [kept], "dry_run": False}).json()
        both = admin.post(
            "/api/replay", json={"ids": [reset], "reset_attempts": True, "dry_run": False}
        ).json()
        assert (one["affected"], both["affected"]) == (1, 1)
        recent = admin.get("/api/audit", params={"limit": 2}).json()

    started = datetime.now(UTC)
    rows = job_rows(retry_db, [kept, reset, invalid])
    assert rows[kept]["status"] == "pending" and rows[kept]["attempt"] == 4  # attempt kept
    assert rows[reset]["status"] == "pending" and rows[reset]["attempt"] == 0  # attempt reset
    assert all(rows[i]["due_at"] <= started and rows[i]["dead_reason"] is None for i in (kept, reset))
    assert rows[invalid]["status"] == "dead"
    audit = audit_row(retry_db, both["audit_id"])
    assert (audit["actor"], audit["source"], audit["dry_run"], audit["action"]) == (
        "admin",
        "ui",
        False,
        "replay",
    )
    assert (audit["affected"], audit["reset_attempts"], audit["filter"]) == (1, True, {"ids": [reset]})
    assert audit["finished_at"] is not None
    assert [r["id"] for r in recent] == [both["audit_id"], one["audit_id"]]
    with client(airflow_server, tokens["admin"]) as admin:
        left = admin.get("/api/dead-letters", params={"destination": dest}).json()
    assert [j["id"] for j in left["jobs"]] == [invalid]


def test_admin_re_evaluates_invalid_letters_once_the_policies_allow_them(
    airflow_server: AirflowServer, tokens: dict[str, str], retry_db: str
) -> None:
    """Dead invalid because ``orders`` was not allowed when they came; the DAGs folder's policies
    (the api-server's) allow it now. ``elsewhere`` is still not allowed."""
    record = {"destination": None, "dead_reason": "invalid", "reason": "destination 'orders' is not allowed"}
    passes = insert_dead(retry_db, **record, headers=[("retry.destination", b"orders"), ("trace-id", b"t1")])
    fails = insert_dead(retry_db, **record, headers=[("retry.destination", b"elsewhere")])
    fatal = insert_dead(retry_db, "orders", dead_reason="fatal")  # not invalid: never re-evaluated
    ids = [passes, fails, fatal]
    with client(airflow_server, tokens["admin"]) as admin:
        refused = admin.post("/api/reevaluate", json={"ids": ids, "reset_attempts": True})
        assert refused.status_code == 422
        assert refused.json()["detail"] == (
            "reset_attempts does not go with reevaluate: a re-evaluated job keeps its attempt"
        )
        dry = admin.post("/api/reevaluate", json={"ids": ids}).json()
        assert (dry["dry_run"], dry["matched"], dry["would_affect"], dry["skipped"]) == (
            True, 2, 1, {"still invalid": 1},
        )  # fmt: skip
        assert {r["status"] for r in job_rows(retry_db, ids).values()} == {"dead"}
        done = admin.post("/api/reevaluate", json={"ids": ids, "dry_run": False}).json()
    assert done["summary"].startswith(
        "1 of 2 selected dead jobs re-evaluated and made pending (left alone: 1 still invalid)"
    )
    rows = job_rows(retry_db, ids)
    assert (rows[passes]["status"], rows[passes]["destination"], rows[passes]["msg_value"]) == (
        "pending", "orders", b"value",
    )  # fmt: skip
    assert (rows[fails]["status"], rows[fails]["dead_reason"]) == ("dead", "invalid")
    assert "elsewhere" in rows[fails]["reason"] and "not allowed" in rows[fails]["reason"]
    assert (rows[fatal]["status"], rows[fatal]["dead_reason"]) == ("dead", "fatal")
    audit = audit_row(retry_db, done["audit_id"])
    assert (audit["action"], audit["actor"], audit["source"], audit["dry_run"], audit["affected"]) == (
        "reevaluate", "admin", "ui", False, 1,
    )  # fmt: skip


def test_a_replay_too_large_for_one_request_becomes_a_dlq_replay_run_that_does_it(
    airflow_server: AirflowServer, tokens: dict[str, str], retry_db: str, dest: str
) -> None:
    first = insert_dead(retry_db, dest)
    copies(retry_db, first, 10_000)  # 10 000 more like it: one over the bound
    # a letter of another writer: the replay asks for the service's own only, and the run keeps to it
    theirs = insert_dead(retry_db, dest, source_topic="webui.work.dlq", dead_reason="adopted")
    airflow = [airflow_bin()]
    # The page triggers runs of the dlq_replay DAG: Airflow must know it (a dag processor would parse it).
    subprocess.run([*airflow, "dags", "reserialize"], env=airflow_server.env, check=True, capture_output=True)
    audits = audit_count(retry_db)
    with client(airflow_server, tokens["admin"]) as admin:
        ours = {"destination": dest, "written_by": "retry-scheduler"}
        dry = admin.post("/api/replay", json={**ours, "dry_run": True}).json()
        assert (dry["would_affect"], dry["page_limit"]) == (10_001, 10_000)
        handed = admin.post("/api/replay", json={**ours, "dry_run": False})
    assert handed.status_code == 200, handed.text
    result = handed.json()
    run_id = result["dag_run_id"]
    assert result["handed_to_dag"] is True and result["would_affect"] == 10_001
    assert result["dag_run_url"] == f"/dags/dlq_replay/runs/{run_id}"
    assert result["summary"].startswith(
        f"10,001 jobs is more than this page replays at once: dlq_replay run {run_id}"
    )
    # Nothing changed inside the request: only the dry run was audited.
    assert audit_count(retry_db) == audits + 1
    with psycopg.connect(retry_db) as conn:
        dead = conn.execute(
            "SELECT count(*) FROM retry_jobs_all WHERE destination = %s AND status = 'dead'", (dest,)
        )
        assert dead.fetchone() == (10_002,)

    auth = {"Authorization": f"Bearer {tokens['admin']}"}
    run = httpx.get(f"{airflow_server.base_url}/api/v2/dags/dlq_replay/dagRuns/{run_id}", headers=auth).json()
    assert run["conf"] == {
        "destination": dest, "written_by": "retry-scheduler", "action": "replay", "reset_attempts": False,
        "dry_run": False,
    }  # fmt: skip
    assert run["triggering_user_name"] == "admin"
    dag = httpx.get(f"{airflow_server.base_url}/api/v2/dags/dlq_replay", headers=auth).json()
    assert result["dag_paused"] == dag["is_paused"]

    # The run's task does the work, audited as the user who asked, from the DAG.
    done = subprocess.run(
        [*airflow, "tasks", "test", "dlq_replay", "operate", run_id],
        env=airflow_server.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with psycopg.connect(retry_db, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT status::text AS status, count(*) AS n FROM retry_jobs_all WHERE destination = %s GROUP BY 1",
            (dest,),
        ).fetchall()
        audit = conn.execute("SELECT * FROM retry_dlq_audit ORDER BY id DESC LIMIT 1").fetchone()
    assert {r["status"]: r["n"] for r in rows} == {"dead": 1, "pending": 10_001}
    assert job_rows(retry_db, [theirs])[theirs]["status"] == "dead"  # exactly what was asked, no more
    assert audit is not None
    assert (audit["actor"], audit["source"], audit["run_id"], audit["affected"]) == (
        "admin",
        "dag",
        run_id,
        10_001,
    )
    assert audit["rate_per_s"] == 1000.0  # over 10 000 jobs of a destination: paced by default


def test_a_replay_from_the_page_goes_at_the_pace_asked(
    airflow_server: AirflowServer, tokens: dict[str, str], retry_db: str, dest: str
) -> None:
    """The page's pace: the dry run says a small replay is not paced; three jobs replayed at 2/s fall
    due half a second apart; the outcome and the audit say the pace; a bad rate is a 422."""
    jobs = [insert_dead(retry_db, dest) for _ in range(3)]
    with client(airflow_server, tokens["admin"]) as admin:
        dry = admin.post("/api/replay", json={"ids": jobs, "dry_run": True}).json()
        assert (dry["rate_per_s"], dry["default_pace"]) == (None, True)
        assert "not paced: every job due at once" in dry["summary"]
        assert admin.post("/api/replay", json={"ids": jobs, "rate": -1, "dry_run": False}).status_code == 422
        assert admin.post("/api/purge", json={"ids": jobs, "rate": 2, "dry_run": False}).status_code == 422
        paced = admin.post("/api/replay", json={"ids": jobs, "rate": 2, "dry_run": False}).json()
    assert (paced["affected"], paced["rate_per_s"], paced["paced_s"]) == (3, 2.0, 1.0)
    assert "paced at 2 jobs/s per destination" in paced["summary"]
    due = sorted(row["due_at"] for row in job_rows(retry_db, jobs).values())
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(due)]
    assert gaps == [pytest.approx(0.5, abs=1e-5)] * 2
    assert audit_row(retry_db, paced["audit_id"])["rate_per_s"] == 2.0


def test_a_re_evaluation_too_large_for_one_request_becomes_a_dlq_replay_run_that_does_it(
    airflow_server: AirflowServer, tokens: dict[str, str], retry_db: str
) -> None:
    """10 001 letters dead invalid because ``orders`` was not yet allowed (a reason of their own to
    select them by); the DAGs folder's policies allow it now."""
    token = f"cfg-{uuid.uuid4().hex[:8]}"
    first = insert_dead(
        retry_db, None, dead_reason="invalid", reason=f"destination 'orders' is not allowed ({token})",
        headers=[("retry.destination", b"orders")],
    )  # fmt: skip
    copies(retry_db, first, 10_000)
    airflow = [airflow_bin()]
    subprocess.run([*airflow, "dags", "reserialize"], env=airflow_server.env, check=True, capture_output=True)
    with client(airflow_server, tokens["admin"]) as admin:
        handed = admin.post("/api/reevaluate", json={"search": token, "dry_run": False})
    assert handed.status_code == 200, handed.text
    result = handed.json()
    run_id = result["dag_run_id"]
    assert result["handed_to_dag"] is True and result["would_affect"] == 10_001
    with psycopg.connect(retry_db) as conn:  # nothing changed inside the request
        assert conn.execute(
            "SELECT count(*) FROM retry_jobs WHERE status = 'dead' AND reason LIKE %s", (f"%{token}%",)
        ).fetchone() == (10_001,)
    auth = {"Authorization": f"Bearer {tokens['admin']}"}
    run = httpx.get(f"{airflow_server.base_url}/api/v2/dags/dlq_replay/dagRuns/{run_id}", headers=auth).json()
    assert run["conf"] == {"search": token, "action": "reevaluate", "reset_attempts": False, "dry_run": False}

    done = subprocess.run(
        [*airflow, "tasks", "test", "dlq_replay", "operate", run_id],
        env=airflow_server.env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with psycopg.connect(retry_db, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT status::text AS status, destination, count(*) AS n FROM retry_jobs_all"
            " WHERE id BETWEEN %s AND %s GROUP BY 1, 2",
            (first, first + 10_000),
        ).fetchall()
        audit = conn.execute("SELECT * FROM retry_dlq_audit ORDER BY id DESC LIMIT 1").fetchone()
    assert rows == [{"status": "pending", "destination": "orders", "n": 10_001}]  # the first and its copies
    assert audit is not None
    assert (audit["action"], audit["actor"], audit["source"], audit["run_id"], audit["affected"]) == (
        "reevaluate", "admin", "dag", run_id, 10_001,
    )  # fmt: skip


def test_purge_deletes_only_jobs_already_on_the_dlq_topic(
    airflow_server: AirflowServer, tokens: dict[str, str], retry_db: str, dest: str
) -> None:
    on_dlq = insert_dead(retry_db, dest)
    not_yet = insert_dead(retry_db, dest, dlq_published_at=None)
    with client(airflow_server, tokens["admin"]) as admin:
        refused = admin.post("/api/purge", json={"destination": dest, "reset_attempts": True})
        assert refused.status_code == 422 and "replay only" in refused.json()["detail"]
        done = admin.post("/api/purge", json={"destination": dest, "dry_run": False}).json()
    assert (done["matched"], done["affected"], done["skipped"]) == (2, 1, {"not yet on the DLQ topic": 1})
    assert set(job_rows(retry_db, [on_dlq, not_yet])) == {not_yet}
    audit = audit_row(retry_db, done["audit_id"])
    assert (audit["action"], audit["actor"], audit["affected"]) == ("purge", "admin", 1)


# --- browsing ------------------------------------------------------------------------------------------


def test_each_letter_says_who_wrote_it_and_the_list_and_a_replay_filter_on_it(
    airflow_server: AirflowServer, tokens: dict[str, str], retry_db: str, dest: str
) -> None:
    ours = insert_dead(retry_db, dest)
    shared = insert_dead(retry_db, dest, source_topic="webui.work.dlq", dead_reason="adopted")
    streamed = insert_dead(retry_db, dest, source_topic="webui.clicks.dlq", dead_reason="exhausted")
    gone = insert_dead(retry_db, dest, source_topic="no.longer.adopted", dead_reason="adopted")
    with client(airflow_server, tokens["viewer"]) as viewer:
        writers = viewer.get("/api/writers").json()
        listed = viewer.get("/api/dead-letters", params={"destination": dest}).json()["jobs"]
        share_only = viewer.get(
            "/api/dead-letters", params={"destination": dest, "written_by": "share"}
        ).json()
        by_us = viewer.get(
            "/api/dead-letters", params={"destination": dest, "written_by": "retry-scheduler"}
        ).json()
        spring = viewer.get("/api/dead-letters", params={"written_by": "spring"})
        nobody = viewer.get("/api/dead-letters", params={"written_by": "camel"})
    with client(airflow_server, tokens["admin"]) as admin:
        dry = admin.post(
            "/api/replay", json={"destination": dest, "written_by": "streams", "dry_run": True}
        ).json()

    assert writers == ["retry-scheduler", "streams", "share"]  # this service, and the adopted formats
    assert {j["id"]: (j["written_by"], j["source_topic"]) for j in listed} == {
        ours: ("retry-scheduler", "retry"),
        shared: ("share", "webui.work.dlq"),
        streamed: ("streams", "webui.clicks.dlq"),  # adopted with :retry, then dead by its policy
        gone: (None, "no.longer.adopted"),  # a topic the deployment no longer names: not known
    }
    assert [j["id"] for j in share_only["jobs"]] == [shared]
    assert [j["id"] for j in by_us["jobs"]] == [ours]
    assert spring.status_code == 422 and "no topic of RETRY_ADOPT_TOPICS has the format spring" in spring.text
    assert nobody.status_code == 422 and "written by must be one of retry-scheduler, spring" in nobody.text
    assert (dry["matched"], dry["would_affect"]) == (1, 1)
    assert audit_row(retry_db, dry["audit_id"])["filter"] == {
        "destination": dest,
        "source_topics": ["webui.clicks.dlq"],
    }


def test_filters_search_and_keyset_pages(
    airflow_server: AirflowServer, tokens: dict[str, str], retry_db: str, dest: str
) -> None:
    base = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
    specs = [
        ("exhausted", "TimeoutError", "TimeoutError: broker did not answer in 30 s"),
        ("fatal", "SchemaError", "SchemaError: field 'amount' missing"),
        ("exhausted", "requests.ReadTimeout", "ReadTimeout: payment gateway took too long"),
        ("expired", "ConnectionRefusedError", "Connection REFUSED by inventory-service"),
        ("fatal", "SchemaError", "SchemaError: 'currency' is not a string"),
        ("exhausted", "TimeoutError", "TimeoutError: broker did not answer in 60 s"),
        ("requested", None, None),
    ]
    ids = [
        insert_dead(
            retry_db, dest, dead_reason=r, error_class=e, reason=t, dead_at=base + timedelta(minutes=i)
        )
        for i, (r, e, t) in enumerate(specs)
    ]
    newest_first = ids[::-1]
    other = insert_dead(retry_db, f"{dest}-other", dead_at=base + timedelta(minutes=30))

    with client(airflow_server, tokens["viewer"]) as viewer:

        def listed(**params: Any) -> list[int]:
            response = viewer.get("/api/dead-letters", params={"destination": dest, **params})
            assert response.status_code == 200, response.text
            return [j["id"] for j in response.json()["jobs"]]

        first = viewer.get("/api/dead-letters", params={"destination": dest}).json()
        assert [j["id"] for j in first["jobs"]] == newest_first
        assert (first["total"], first["total_capped"], first["next_cursor"]) == (7, False, None)
        assert other not in listed()
        row = first["jobs"][-1]
        assert row["reason"] == specs[0][2] and row["dead_at"] == base.isoformat()

        assert listed(dead_reason="fatal") == [ids[4], ids[1]]
        assert listed(error_class="*Timeout*") == [ids[5], ids[2], ids[0]]
        assert listed(error_class="SchemaError") == [ids[4], ids[1]]
        assert listed(search="refused") == [ids[3]]  # any case, in the reason
        assert listed(search="timeout") == [ids[5], ids[2], ids[0]]  # the error class counts too
        assert listed(search="100%") == []  # % is a character, not a wildcard
        assert listed(since=(base + timedelta(minutes=2)).isoformat(), until="2026-11-20T12:05:00Z") == [
            ids[4],
            ids[3],
            ids[2],
        ]
        assert listed(dead_reason="exhausted", search="broker") == [ids[5], ids[0]]

        # Keyset pages: newest first, no job twice, none left out, the count on the first page.
        pages: list[list[int]] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"destination": dest, "page_size": 3}
            if cursor:
                params.update(cursor=cursor, count="false")
            page = viewer.get("/api/dead-letters", params=params).json()
            assert page["total"] == (7 if cursor is None else -1)
            pages.append([j["id"] for j in page["jobs"]])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == [newest_first[:3], newest_first[3:6], newest_first[6:]]

        for params, message in [
            ({"dead_reason": "bored"}, "dead reason 'bored' is not one of"),
            ({"since": "yesterday"}, "ISO-8601 time like 2026-11-21T10:00:00Z"),
            ({"since": "2026-11-21T10:00:00"}, "needs a time zone"),
            ({"cursor": "nonsense"}, "is not one this service handed out"),
            ({"destination": "no spaces"}, "is not a valid topic name"),
        ]:
            bad = viewer.get("/api/dead-letters", params=params)
            assert bad.status_code == 422 and message in bad.json()["detail"], (params, bad.text)
        assert viewer.get("/api/dead-letters", params={"page_size": 0}).status_code == 422


def test_the_page_selects_what_the_command_line_and_the_bulk_retry_select(
    airflow_server: AirflowServer, tokens: dict[str, str], retry_db: str, dest: str
) -> None:
    """One selection: the page's filters, under the same names, pick the jobs ``dlq list`` and the
    bulk retry's count pick from the same rows (tests/spark/test_one_selection.py runs the others)."""
    from retry_scheduler.db.selection import Selection
    from retry_scheduler.ops.browse import list_dead
    from retry_scheduler.spark.selection import summarize

    base = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)
    for i in range(12):
        insert_dead(
            retry_db, dest, dead_reason=("exhausted", "fatal", "expired")[i % 3],
            error_class=("TimeoutError", "SchemaError")[i % 2], reason=f"case {i}: {'declined' if i % 4 else 'late'}",
            dead_at=base + timedelta(minutes=10 * i), source_topic="webui.work.dlq" if i % 5 == 0 else "retry",
        )  # fmt: skip
    settings = Settings(database_url=retry_db, adopt_topics={"webui.work.dlq": "share"})
    filters: list[dict[str, Any]] = [
        {"dead_reason": "fatal"},
        {"error_class": "Schema*", "search": "DECLINED"},
        {
            "since": (base + timedelta(minutes=25)).isoformat(),
            "until": (base + timedelta(minutes=85)).isoformat(),
        },
        {"written_by": "share"},
        {"since": "95m", "error_class": "*Error"},  # a duration ago: no job within minutes of it
    ]
    with client(airflow_server, tokens["viewer"]) as viewer:
        for given in filters:
            params = {"destination": dest, **given}
            page = viewer.get("/api/dead-letters", params={**params, "page_size": 500})
            assert page.status_code == 200, page.text
            on_page = {j["id"] for j in page.json()["jobs"]}
            selection = Selection.from_params(params, settings)
            assert on_page == {j.id for j in list_dead(retry_db, selection, page_size=500).jobs}, given
            assert summarize(retry_db, selection).count == len(on_page) > 0, given


def test_a_big_selection_shows_a_capped_count(
    airflow_server: AirflowServer, tokens: dict[str, str], retry_db: str, dest: str
) -> None:
    with psycopg.connect(retry_db) as conn:
        conn.execute(
            """
            INSERT INTO retry_jobs (source_topic, source_partition, source_offset, source_timestamp_ms,
                destination, attempt, policy, retry_id, first_seen_at, due_at, status, dead_reason,
                dlq_topic, dead_at)
            SELECT 'bulk', 0, n, 0, %s, 1, 'default', 'bulk-' || n, now(), now(), 'dead', 'exhausted',
                   'retry.dlq', now() - n * interval '1 ms'
            FROM generate_series(1, 10050) AS n
            """,
            (dest,),
        )
    with client(airflow_server, tokens["viewer"]) as viewer:
        page = viewer.get("/api/dead-letters", params={"destination": dest, "page_size": 500}).json()
    assert (page["total"], page["total_capped"], len(page["jobs"])) == (10000, True, 500)
    assert page["next_cursor"]


def test_detail_returns_text_as_data_binary_as_hex_and_cuts_long_values(
    airflow_server: AirflowServer, tokens: dict[str, str], retry_db: str, dest: str
) -> None:
    script = b'{"note": "<script>alert(1)</script><img src=x onerror=alert(2)>"}'
    job = insert_dead(
        retry_db,
        dest,
        msg_key=bytes([0x00, 0xFF, 0x10, 0x80]),
        msg_value=script,
        headers=[
            ("retry.reason", "Zeitüberschreitung".encode()),
            ("trace", b"\x00\x01\x02"),
            ("empty", None),
        ],
        reason="<b>not bold</b>",
    )
    long_job = insert_dead(retry_db, dest, msg_value=b"x" * 10_000, msg_key=None)
    with client(airflow_server, tokens["admin"]) as operator:  # payloads need the operator's permission
        shown = operator.get(f"/api/dead-letters/{job}").json()
        long_shown = operator.get(f"/api/dead-letters/{long_job}").json()
    with client(airflow_server, tokens["viewer"]) as viewer:
        as_viewer = viewer.get(f"/api/dead-letters/{job}").json()
        missing = viewer.get("/api/dead-letters/999999999")
        pending = insert_dead(retry_db, dest)
        with psycopg.connect(retry_db, autocommit=True) as conn:
            conn.execute(
                "UPDATE retry_jobs SET status = 'pending', dead_reason = NULL WHERE id = %s", (pending,)
            )
        not_dead = viewer.get(f"/api/dead-letters/{pending}")
    # A job that is not dead (replayed, or never dead) is not served: not its payload either.
    assert not_dead.status_code == 404
    assert (
        not_dead.json()["detail"]
        == f"Job {pending} is no longer dead: it is pending. This page shows dead jobs only."
    )
    assert "value" not in not_dead.json()
    # Nothing is escaped server side: the page inserts text as text.
    assert shown["value"] == {
        "encoding": "utf-8",
        "text": script.decode(),
        "size": len(script),
        "truncated": False,
    }
    assert shown["reason"] == "<b>not bold</b>"
    assert shown["key"] == {"encoding": "hex", "text": "00 ff 10 80", "size": 4, "truncated": False}
    assert shown["headers"] == [
        {
            "name": "retry.reason",
            "value": {"encoding": "utf-8", "text": "Zeitüberschreitung", "size": 19, "truncated": False},
        },
        {"name": "trace", "value": {"encoding": "hex", "text": "00 01 02", "size": 3, "truncated": False}},
        {"name": "empty", "value": None},
    ]
    assert (shown["id"], shown["status"], shown["destination"], shown["dead_reason"]) == (
        job,
        "dead",
        dest,
        "exhausted",
    )
    assert shown["payload_hidden"] is False
    # A Viewer sees the metadata and the sizes, not the bytes.
    assert as_viewer["payload_hidden"] is True
    assert (as_viewer["id"], as_viewer["reason"], as_viewer["destination"]) == (job, "<b>not bold</b>", dest)
    hidden = {"encoding": "hidden", "text": "", "truncated": False}
    assert as_viewer["value"] == {**hidden, "size": len(script)}
    assert as_viewer["key"] == {**hidden, "size": 4}
    assert as_viewer["headers"] == [
        {"name": "retry.reason", "value": {**hidden, "size": 19}},
        {"name": "trace", "value": {**hidden, "size": 3}},
        {"name": "empty", "value": None},
    ]
    assert script.decode() not in json.dumps(as_viewer)
    assert long_shown["key"] is None
    assert long_shown["value"] == {"encoding": "utf-8", "text": "x" * 4096, "size": 10_000, "truncated": True}
    assert missing.status_code == 404 and "there is no job 999999999" in missing.json()["detail"]


def test_facets_count_dead_jobs_per_destination_and_reason(
    airflow_server: AirflowServer, tokens: dict[str, str], retry_db: str, dest: str
) -> None:
    insert_dead(retry_db, dest, dead_reason="fatal")
    insert_dead(retry_db, dest, dead_reason="fatal")
    insert_dead(retry_db, dest, dead_reason="expired")
    with client(airflow_server, tokens["viewer"]) as viewer:
        facets = viewer.get("/api/facets").json()
    mine = {f["dead_reason"]: f["count"] for f in facets if f["destination"] == dest}
    assert mine == {"fatal": 2, "expired": 1}


# --- under load --------------------------------------------------------------------------------------


def test_two_hundred_concurrent_searches_use_a_few_connections_and_the_loops_keep_working(
    airflow_server: AirflowServer,
    tokens: dict[str, str],
    retry_db: str,
    dest: str,
    bootstrap_servers: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from retry_scheduler.core import protocol
    from retry_scheduler.core.policy import Policy, PolicyRegistry
    from retry_scheduler.db.store import Store
    from retry_scheduler.loops.ingest import IngestCounts, Ingestor
    from retry_scheduler.loops.publish import Publisher
    from tests.conftest import TEST_DESTINATIONS
    from tests.kafkautil import consume, create_topics, produce

    for n in range(30):
        insert_dead(retry_db, dest, reason=f"TimeoutError: call {n} timed out")
    due = insert_dead(retry_db, dest, status="pending", dead_reason=None, dead_at=None, dlq_published_at=None)
    create_topics(bootstrap_servers, [dest])
    # Five failures arrive on the retry topic while the page is flooded: ingested, then published.
    settings = Settings(
        database_url=retry_db,
        kafka={"bootstrap.servers": bootstrap_servers},
        retry_topic=f"{dest}-retry",
        consumer_group=f"{dest}-scheduler",
        destination_allowlist=TEST_DESTINATIONS,
    )
    failures = [
        {"key": b"failed-%d" % i, "value": b"v", "headers": [(protocol.DESTINATION, dest.encode()), (protocol.AT, b"0")]}
        for i in range(5)
    ]  # fmt: skip
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:  # the page's connections to the retry database, as PostgreSQL sees them
        with psycopg.connect(retry_db, autocommit=True) as conn:
            while not stop.is_set():
                [(n,)] = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'retry-scheduler-dead-letters'"
                    " AND datname = current_database()"  # another test's page (another worker) is not this one
                ).fetchall()
                seen.append(int(n))
                time.sleep(0.02)

    def search(n: int) -> int:
        with client(airflow_server, tokens["viewer"]) as viewer:
            return viewer.get(
                "/api/dead-letters", params={"destination": dest, "search": f"call {n % 30}"}
            ).status_code

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with ThreadPoolExecutor(max_workers=200) as pool:
        answers = pool.map(search, range(200))
        # Meanwhile the ingest and publish loops work on the same database.
        with Store(retry_db) as store:
            ingestor = Ingestor(
                Deployment(settings, PolicyRegistry.of([Policy("default", delays=["1s"])])), store
            )
            produce(bootstrap_servers, settings.retry_topic, failures)
            ingested, deadline = IngestCounts(), time.monotonic() + 30
            try:
                while ingested.consumed < len(failures) and time.monotonic() < deadline:
                    ingested.add(ingestor.ingest_batch(0.5))
            finally:
                ingestor.close()
        with Store(retry_db) as store:
            publisher = Publisher(Deployment.load(settings), store)
            try:
                published = publisher.publish_once().published
            finally:
                publisher.close()
        codes = list(answers)
    stop.set()
    watcher.join()

    assert codes == [200] * 200
    assert 0 < max(seen) <= 4  # RETRY_WEB_POOL_SIZE: the page never holds more, whatever comes in
    assert (ingested.stored, ingested.pending) == (5, 5)
    assert published == 6  # (the other tests' pending jobs have no topic: not published)
    with psycopg.connect(retry_db) as conn:
        assert conn.execute(
            "SELECT count(*) FROM retry_jobs_all WHERE destination = %s AND status = 'published'", (dest,)
        ).fetchone() == (6,)
    keys = sorted(s.key for s in consume(bootstrap_servers, [dest], 6))
    assert keys == sorted([b"key", *(r["key"] for r in failures)])
    assert job_rows(retry_db, [due])[due]["status"] == "published"


# --- waiting chains (ordered mode) ---------------------------------------------------------------------


def test_waiting_chains_are_listed_and_an_operator_releases_a_stuck_one(
    airflow_server: AirflowServer, tokens: dict[str, str], retry_db: str, dest: str
) -> None:
    chain = f"chain-{uuid.uuid4().hex[:8]}"
    held_due = datetime(9999, 12, 31, tzinfo=UTC)
    first = insert_dead(retry_db, dest, status="pending", dead_reason=None, dead_at=None, dlq_published_at=None,
                        held_by=chain, due_at=held_due, original_partition=0, original_offset=2)  # fmt: skip
    insert_dead(retry_db, dest, status="pending", dead_reason=None, dead_at=None, dlq_published_at=None,
                held_by=chain, due_at=held_due, original_partition=0, original_offset=3)  # fmt: skip
    with psycopg.connect(retry_db) as conn:  # its head's retry went out and was never released
        conn.execute(
            "INSERT INTO retry_released_holds (blocker, why, head) VALUES (%s, 'blocked', 'gone')", [chain]
        )
    with client(airflow_server, tokens["viewer"]) as viewer:
        [listed] = [
            c for c in viewer.get("/api/chains", params={"stuck": True}).json() if c["chain"] == chain
        ]
        assert (listed["waiting"], listed["key"], listed["destination"], listed["head"], listed["stuck"]) == (
            2, "key", dest, "gone", True
        )  # fmt: skip
        refused = viewer.post("/api/chains/release", json={"chains": [chain]})
        assert refused.status_code == 403
    with client(airflow_server, tokens["admin"]) as admin:
        assert admin.post("/api/chains/release", json={"chains": []}).status_code == 422
        assert admin.post("/api/chains/release", json={"chains": [chain], "dryrun": True}).status_code == 422
        done = admin.post("/api/chains/release", json={"chains": [chain, "nope"], "why": "INC-7"}).json()
        assert done == {"released": [chain], "heads_dead": [], "not_waiting": ["nope"]}
        [after] = [c for c in admin.get("/api/chains").json() if c["chain"] == chain]
        assert (after["waiting"], after["state"], after["stuck"]) == (
            1,
            "dead",
            False,
        )  # going out, one at a time
        [audit] = [a for a in admin.get("/api/audit").json() if a["action"] == "release_chains"][:1]
    assert (audit["actor"], audit["source"], audit["filter"]["chains"]) == ("admin", "ui", [chain, "nope"])
    assert job_rows(retry_db, [first])[first]["due_at"] < held_due  # the first held record falls due
    with psycopg.connect(retry_db) as conn:
        state = conn.execute(
            "SELECT why, head FROM retry_released_holds WHERE blocker = %s", [chain]
        ).fetchone()
    assert state == ("dead", "gone")


# --- breakers ---------------------------------------------------------------------------------------


def test_an_open_breaker_is_shown_and_an_operator_closes_it(
    airflow_server: AirflowServer, tokens: dict[str, str], retry_db: str, dest: str
) -> None:
    breaker_due = datetime(9999, 12, 30, tzinfo=UTC)
    held = insert_dead(retry_db, dest, status="pending", dead_reason=None, dead_at=None, dlq_published_at=None,
                       due_at=breaker_due)  # fmt: skip
    with psycopg.connect(retry_db) as conn:  # as the publish loop leaves an open breaker and its held job
        conn.execute(
            "INSERT INTO retry_destinations (destination) VALUES (%s) ON CONFLICT DO NOTHING", [dest]
        )
        conn.execute(
            "UPDATE retry_destinations SET breaker = 'open', breaker_since = now(), breaker_trips = 1, "
            "breaker_reason = '20 of 20 records sent came back' WHERE destination = %s",
            [dest],
        )
        conn.execute(
            "INSERT INTO retry_breaker_holds (id, destination, due_at) VALUES (%s, %s, now() - interval '1 minute')",
            [held, dest],
        )
    with client(airflow_server, tokens["viewer"]) as viewer:
        [listed] = [b for b in viewer.get("/api/breakers").json() if b["destination"] == dest]
        assert (listed["state"], listed["paused"], listed["trips"], listed["reason"]) == (
            "open", 1, 1, "20 of 20 records sent came back"
        )  # fmt: skip
        assert viewer.post("/api/breakers/close", json={"destinations": [dest]}).status_code == 403
    with client(airflow_server, tokens["admin"]) as admin:
        assert admin.post("/api/breakers/close", json={"destinations": []}).status_code == 422
        assert admin.post("/api/breakers/close", json={"destinations": ["x" * 300]}).status_code == 422
        done = admin.post("/api/breakers/close", json={"destinations": [dest, "nope"], "why": "fixed"}).json()
        assert done == {"closed": [dest], "unknown": ["nope"]}
        [after] = [b for b in admin.get("/api/breakers").json() if b["destination"] == dest]
    # Closed by hand; its held job goes once the publish loop's next tick lets it go.
    assert (after["state"], after["reason"], after["paused"]) == (
        "closed",
        "closed by admin on the dead letters page: fixed",
        1,
    )
