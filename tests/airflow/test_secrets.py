"""No password leaks: the Spark DAGs and the CLI against a PostgreSQL that really asks for one.

A private PostgreSQL cluster (started from the machine's binaries by the dev tooling) lets the
service's role in only with its password (scram-sha-256), and the Kafka connection carries a SASL
password too. Both Spark DAGs run through ``dag.test()`` and both Spark commands through the CLI,
while a watcher reads the command line of every process on the machine; afterwards neither password
may be in any command line, XCom, rendered field, task log or output.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from bench.jobs import insert_jobs
from retry_scheduler.db.schema import migrate
from retry_scheduler.db.store import Store
from retry_scheduler.dev.postgres import ensure_postgres
from retry_scheduler.dev.procs import free_port, terminate
from tests.airflow.conftest import AIRFLOW_DB, AIRFLOW_HOME
from tests.airflow.test_spark_dags import dead_job, get_dag
from tests.conftest import _db_url
from tests.kafkautil import consume, create_topics

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.integration]

DB_PASSWORD = "pg-Pa55-9f3c1e"
SASL_PASSWORD = "sasl-Pa55-77ab04"
SECRETS = (DB_PASSWORD, SASL_PASSWORD)


@pytest.fixture(scope="module")
def password_database() -> Iterator[str]:
    """A private PostgreSQL whose ``retry_svc`` role gets in over TCP only with its password."""
    home = Path(tempfile.mkdtemp(prefix="retry-pw-pg-"))
    home.chmod(0o755)  # the postgres account (we may be root) must reach its data directory
    port = free_port()
    admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    proc = ensure_postgres(admin, home / "data", say=lambda _m: None)
    assert proc is not None
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE retry_svc LOGIN PASSWORD '{DB_PASSWORD}'")
            conn.execute("CREATE DATABASE retry OWNER retry_svc")
            hba = conn.execute("SHOW hba_file").fetchone()[0]
        # Only the superuser stays trusted (over the socket, for setting up); the service must prove itself.
        Path(hba).write_text(
            "local all postgres trust\nhost all postgres 127.0.0.1/32 trust\n"
            "host all retry_svc 127.0.0.1/32 scram-sha-256\n"
        )
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
        url = f"postgresql://retry_svc:{DB_PASSWORD}@127.0.0.1:{port}/retry"
        migrate(url)
        yield url
    finally:
        terminate(proc, "postgres", timeout=20)
        shutil.rmtree(home, ignore_errors=True)


class CommandLines:
    """Reads the command line of every process of the machine, over and over, while it runs."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            for proc in Path("/proc").iterdir():
                if proc.name.isdigit():
                    with contextlib.suppress(OSError):  # gone already
                        self.seen.add(
                            (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                        )
            time.sleep(0.02)

    def __enter__(self) -> CommandLines:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def assert_no_secret(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"a password is in {where}"


def test_a_wrong_password_is_refused(password_database: str) -> None:
    # The protection is real: without the password the role does not get in.
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(password_database.replace(DB_PASSWORD, "wrong"), connect_timeout=5).close()


def test_a_wrong_password_is_said_to_be_one(password_database: str) -> None:
    """The server answers and refuses: the message says so and where the password is set, not "is it
    running?", and never the password tried."""
    env = {
        **os.environ,
        "RETRY_DATABASE_URL": password_database.replace(DB_PASSWORD, "wrong-" + DB_PASSWORD[:4]),
    }
    cli = Path(sys.executable).parent / "retry-scheduler"
    done = subprocess.run([str(cli), "status"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"retry-scheduler: PostgreSQL at {password_database.replace(DB_PASSWORD, '***')} refused user retry_svc: "
        "password authentication failed. Check the password in RETRY_DATABASE_URL or the retry_postgres "
        "connection."
    ]
    assert DB_PASSWORD[:4] not in done.stderr


def test_no_password_in_argv_xcom_logs_or_output(
    airflow_db: Path,
    password_database: str,
    bootstrap_servers: str,
    topic_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    from airflow.utils.state import DagRunState

    kafka = {
        "bootstrap.servers": bootstrap_servers,
        "sasl.mechanism": "PLAIN",
        "sasl.username": "retry-svc",
        "sasl.password": SASL_PASSWORD,
    }
    archive = tmp_path / "archive"
    venv_bin = str(Path(sys.executable).parent)
    for key, value in {
        "AIRFLOW_CONN_RETRY_POSTGRES": password_database,
        "AIRFLOW_CONN_RETRY_KAFKA": json.dumps({"conn_type": "kafka", "extra": kafka}),
        "AIRFLOW_CONN_SPARK_DEFAULT": "spark://local%5B2%5D?deploy-mode=client",
        "RETRY_ARCHIVE_URI": archive.as_uri(),
        "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}",
        "PYSPARK_PYTHON": sys.executable,
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RETRY_DATABASE_URL", raising=False)
    dest = f"{topic_prefix}-payments"
    create_topics(bootstrap_servers, [dest])
    with Store(password_database) as store:
        insert_jobs(store, [dead_job(i, dest) for i in range(20)])
        insert_jobs(store, [replace(dead_job(100 + i, dest), retry_id=f"cli-{i}") for i in range(10)])

    started = datetime.now(UTC)
    with CommandLines() as lines:
        bulk = get_dag("retry_bulk_replay").test(
            run_conf={"destination": dest, "dry_run": False, "limit": 20}
        )
        # Today's run archives what the bulk replay just published.
        tomorrow = datetime.combine(started.date() + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
        compaction = get_dag("retry_compaction").test(logical_date=tomorrow)
        # The CLI, as a user runs it: the connections in its environment, never on its command line.
        cli_env = {
            **os.environ,
            "RETRY_DATABASE_URL": password_database,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers,
            "RETRY_KAFKA_CONFIG": json.dumps({k: v for k, v in kafka.items() if k != "bootstrap.servers"}),
        }
        cli = Path(sys.executable).parent / "retry-scheduler"
        cli_runs = [
            subprocess.run([str(cli), *args], env=cli_env, capture_output=True, text=True, timeout=600)
            for args in (["bulk-retry", "--destination", dest, "--json"], ["compact", "--older-than", "0s"])
        ]

    # Everything really ran, with the passwords: 30 records out, all 30 jobs archived and deleted.
    assert bulk.state == DagRunState.SUCCESS and compaction.state == DagRunState.SUCCESS
    for done in cli_runs:
        assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(cli_runs[0].stdout.strip().splitlines()[-1])["published"] == 10
    assert len(consume(bootstrap_servers, [dest], 30)) == 30
    with psycopg.connect(password_database) as conn:
        assert conn.execute("SELECT count(*) FROM retry_jobs_all").fetchone() == (0,)

    # The watcher saw the jobs' drivers, each given a connection file, not a password.
    drivers = [line for line in lines.seen if "bulk_retry.py" in line or "compact.py" in line]
    assert sum("--connection-file" in line for line in drivers) >= 4, drivers
    for line in lines.seen:
        assert_no_secret(f"the command line {line[:300]!r}", line)

    for done in cli_runs:
        assert_no_secret("the CLI's output", done.stdout + done.stderr)
    out, err = capfd.readouterr()
    assert_no_secret("the output of dag.test()", out + err)
    assert_no_secret("the captured log records", caplog.text)
    task_logs = [
        p
        for p in (AIRFLOW_HOME / "logs").rglob("*")
        if p.is_file() and p.stat().st_mtime >= started.timestamp() - 1
    ]
    for path in task_logs:
        assert_no_secret(f"the task log {path}", path.read_text(errors="replace"))

    with psycopg.connect(_db_url(AIRFLOW_DB)) as conn:
        stored = conn.execute(
            "SELECT x::text FROM xcom x WHERE dag_id IN ('retry_bulk_replay', 'retry_compaction') "
            "AND run_id IN (%s, %s)",
            (bulk.run_id, compaction.run_id),
        ).fetchall()
        rendered = conn.execute(
            "SELECT r::text FROM rendered_task_instance_fields r WHERE run_id IN (%s, %s)",
            (bulk.run_id, compaction.run_id),
        ).fetchall()
    assert any("--destination" in row[0] for row in stored)  # the job's arguments are there, nothing else
    for (row,) in [*stored, *rendered]:
        assert_no_secret("the metadata database (XCom, rendered fields)", row)


def test_a_sqlalchemy_url_is_the_same_server_and_a_malformed_url_is_one_line_without_its_password(
    password_database: str,
) -> None:
    """What every Airflow user has in ``sql_alchemy_conn`` (``postgresql+psycopg2://``) connects as the
    plain URL does; a URL libpq cannot read is one line naming the setting and the form to use, exit
    2, the password in none of it (it was a traceback quoting the whole URL)."""
    cli = Path(sys.executable).parent / "retry-scheduler"

    def status(url: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "RETRY_DATABASE_URL": url}
        return subprocess.run(
            [str(cli), "status", "--json"], env=env, capture_output=True, text=True, timeout=60
        )

    sqlalchemy = status(password_database.replace("postgresql://", "postgresql+psycopg2://", 1))
    assert sqlalchemy.returncode == 0, sqlalchemy.stderr[-2000:]
    assert "pending" in sqlalchemy.stdout
    host = password_database.rsplit("@", 1)[1]
    for malformed in (
        f"postgresql+psycopg2://retry_svc:{DB_PASSWORD}@{host} extra",  # a stray word after it
        f"postgresql://retry_svc:{DB_PASSWORD[:4]} {DB_PASSWORD[4:]}@{host}",  # a space in the password
        f"postgresql://retry_svc:{DB_PASSWORD[:4]}@{DB_PASSWORD[4:]}@{host}?x y",  # an @ in it, unencoded
        f"host=127.0.0.1 password={DB_PASSWORD[:4]} {DB_PASSWORD[4:]} dbname",  # a keyword DSN gone wrong
    ):
        done = status(malformed)
        assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert (
            "is not a PostgreSQL URL" in lines[0]
            and "postgresql://USER:PASSWORD@HOST:5432/DBNAME" in lines[0]
        )
        for piece in (DB_PASSWORD, DB_PASSWORD[:4], DB_PASSWORD[4:]):
            assert piece not in done.stdout + done.stderr, (piece, done.stderr)
    # read by libpq, but with a setting it cannot use: the URL is wrong, not the server ("Is it running?")
    port = host.split(":", 1)[1].split("/", 1)[0]
    for wrong in (f"{host.replace(port, port + ':x', 1)}", f"{host}?sslmode=maybe"):
        done = status(f"postgresql://retry_svc:{DB_PASSWORD}@{wrong}")
        assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
        [line] = done.stderr.strip().splitlines()
        assert line.startswith(
            "retry-scheduler: RETRY_DATABASE_URL or the retry_postgres connection has a setting libpq cannot use:"
        ), line
        assert (
            "Is it running?" not in line and DB_PASSWORD not in line and "postgresql://USER:PASSWORD@" in line
        )
