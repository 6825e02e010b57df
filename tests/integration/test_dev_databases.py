"""The dev tooling's databases: dedicated and marked, another's never taken over, and ``dev clean``
removing exactly what it made."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from retry_scheduler.core.config import Settings
from retry_scheduler.dev.postgres import DEV_METADATA_DB, claim_database, dev_mark, ensure_database
from retry_scheduler.dev.procs import DevStackError, free_port
from retry_scheduler.dev.stack import DevStack
from tests.conftest import ADMIN_URL, ROOT, _db_url

pytestmark = [pytest.mark.integration]

CLI = [sys.executable, "-m", "retry_scheduler.cli.main"]


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Database names for the test (``retry_devdb_<random>_<n>``), dropped afterwards if they exist."""
    stem = f"retry_devdb_{uuid.uuid4().hex[:8]}"
    made = [f"{stem}_{n}" for n in range(4)]
    yield made
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        for name in made:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def comment(name: str) -> str | None:
    with psycopg.connect(ADMIN_URL) as conn:
        row = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s", (name,)
        ).fetchone()
    return None if row is None else row[0]


def exists(name: str) -> bool:
    with psycopg.connect(ADMIN_URL) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def another_airflow_s(name: str) -> None:
    """A database as another Airflow's metadata looks: tables, no comment."""
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    with psycopg.connect(_db_url(name), autocommit=True) as conn:
        conn.execute("CREATE TABLE dag (dag_id text)")
        conn.execute("CREATE TABLE task_instance (state text)")
        conn.execute("INSERT INTO task_instance VALUES ('running')")


def test_the_dev_stack_s_metadata_database_is_its_own_by_default() -> None:
    stack = DevStack(Settings(database_url=_db_url("retry_scheduler")), ROOT / "dags", say=lambda _m: None)
    assert stack.metadata_db == DEV_METADATA_DB == "retry_scheduler_dev_airflow"


def test_a_database_the_tooling_creates_is_marked_and_an_empty_one_is_claimed(names: list[str]) -> None:
    created, empty = names[:2]
    assert ensure_database(_db_url(created), lambda _m: None) is True
    assert comment(created) == dev_mark()
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(empty)))
    claim_database(_db_url(empty), "Airflow's metadata database")
    assert comment(empty) == dev_mark()


def test_another_airflow_s_metadata_database_is_refused_and_left_as_it_was(
    names: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    foreign = names[0]
    another_airflow_s(foreign)
    with pytest.raises(DevStackError) as refused:
        claim_database(_db_url(foreign), "Airflow's metadata database")
    assert str(refused.value).startswith(
        f"Database {foreign} at postgresql://postgres@127.0.0.1:5432/{foreign} holds tables the dev stack did "
        "not create (dag, task_instance): it will not use it as Airflow's metadata database. Use another "
        "database (for Airflow's metadata: RETRY_DEV_METADATA_DB)"
    )
    # The whole stack, pointed at it as a user would: refused before Airflow touches it.
    monkeypatch.setenv("RETRY_DEV_METADATA_DB", foreign)
    monkeypatch.setenv("RETRY_DEV_HOME", str(tmp_path / "dev"))
    settings = Settings(
        database_url=_db_url(names[1]), kafka={"bootstrap.servers": f"127.0.0.1:{free_port()}"}
    )
    stack = DevStack(settings, ROOT / "dags", api_port=free_port(), say=lambda _m: None)
    with pytest.raises(
        DevStackError, match=f"Database {foreign} .* holds tables the dev stack did not create"
    ):
        stack.start()
    assert stack._procs == [] or all(proc.poll() is not None for _name, proc in stack._procs)
    with psycopg.connect(_db_url(foreign)) as conn:
        assert conn.execute("SELECT state FROM task_instance").fetchall() == [("running",)]  # not failed
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
        ).fetchall()
    assert tables == [("dag",), ("task_instance",)]  # not migrated
    assert comment(foreign) is None


def test_a_retry_database_holding_someone_else_s_tables_is_refused(names: list[str]) -> None:
    foreign = names[0]
    another_airflow_s(foreign)
    with pytest.raises(DevStackError, match="it will not use it as the retry-scheduler database"):
        claim_database(_db_url(foreign), "the retry-scheduler database", also_ours="retry_schema_version")
    with psycopg.connect(_db_url(foreign), autocommit=True) as conn:
        conn.execute("CREATE TABLE retry_schema_version (version int)")
    claim_database(_db_url(foreign), "the retry-scheduler database", also_ours="retry_schema_version")


def dev_clean(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RETRY_DEV_HOME": str(home), "RETRY_DATABASE_URL": _db_url("retry_scheduler")}
    return subprocess.run([*CLI, "dev", "clean", *args], env=env, capture_output=True, text=True, timeout=120)


def test_dev_clean_lists_then_removes_exactly_what_was_made_for_its_dev_home(
    names: list[str], tmp_path: Path
) -> None:
    home = tmp_path / "dev"
    ours, foreign, elsewhere, empty_foreign = names
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        for name in (ours, foreign, elsewhere, empty_foreign):
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        conn.execute(
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(sql.Identifier(ours), sql.Literal(dev_mark(home)))
        )
        conn.execute(
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                sql.Identifier(elsewhere), sql.Literal(dev_mark(tmp_path / "other-checkout" / ".dev"))
            )
        )
    for folder in ("airflow", "logs", "archive", "spark"):
        (home / folder).mkdir(parents=True)
        (home / folder / "kept-until-clean").write_text("x")

    listed = dev_clean(home)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [
        f"would drop database {ours} (postgresql://postgres@127.0.0.1:5432/retry_scheduler)",
        *(f"would remove {home / f}" for f in ("airflow", "logs", "archive")),
        "Nothing removed: add --yes to remove them",
    ]
    assert exists(ours) and (home / "airflow").is_dir()

    # Someone still connected (a stack running): refused, nothing removed.
    with psycopg.connect(_db_url(ours)):
        busy = dev_clean(home, "--yes")
    assert busy.returncode == 2
    assert f"In use: {ours} (1 connection(s)). Stop the dev stack" in busy.stderr
    assert exists(ours) and (home / "logs").is_dir()

    done = dev_clean(home, "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "Removed 1 database(s) and 3 folder(s)"
    assert not exists(ours)
    assert exists(foreign) and exists(elsewhere) and exists(empty_foreign)  # not made for this dev home
    assert sorted(p.name for p in home.iterdir()) == ["spark"]  # the class archive stays without --all

    again = dev_clean(home, "--yes", "--all")
    assert again.stdout.splitlines() == [
        f"removing {home / 'spark'}",
        "Removed 0 database(s) and 1 folder(s)",
    ]
    assert list(home.iterdir()) == []
