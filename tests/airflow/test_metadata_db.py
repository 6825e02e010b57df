"""The dev stack leaves ``airflow db migrate`` out only when the metadata database is at the installed
Airflow's newest migration."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from retry_scheduler.dev.airflow_env import TEMPLATE_PREFIX, migrate_airflow_metadata
from retry_scheduler.dev.postgres import airflow_metadata_current, airflow_migrations_head

pytestmark = [pytest.mark.airflow, pytest.mark.integration]


def test_the_head_read_from_the_scripts_is_airflow_s_own() -> None:
    from airflow.utils.db import _REVISION_HEADS_MAP  # by the release that added each, oldest first

    assert airflow_migrations_head() == list(_REVISION_HEADS_MAP.values())[-1]


def test_only_a_database_at_the_head_is_current(airflow_db: Path, bare_database_url: str) -> None:
    migrated = os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert airflow_metadata_current(migrated)
    assert not airflow_metadata_current(bare_database_url)  # never migrated: no alembic_version
    with psycopg.connect(bare_database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('937cbd173ca1')")  # an older migration
    assert not airflow_metadata_current(bare_database_url)
    assert not airflow_metadata_current(bare_database_url.rsplit("/", 1)[0] + "/no_such_database")

    # What the stack runs when it is not current brings it there: a database with tables of its own
    # (an older Airflow's) is migrated in place, keeping them.
    with psycopg.connect(bare_database_url, autocommit=True) as conn:
        conn.execute("DROP TABLE alembic_version")
        conn.execute("CREATE TABLE kept (note text)")
        conn.execute("INSERT INTO kept VALUES ('ours')")
    said: list[str] = []
    migrate_airflow_metadata(
        {**os.environ, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": bare_database_url}, said.append
    )
    assert airflow_metadata_current(bare_database_url)
    assert said == ["Migrating the Airflow metadata database"]
    with psycopg.connect(bare_database_url) as conn:
        assert conn.execute("SELECT note FROM kept").fetchall() == [("ours",)]


def test_an_empty_database_becomes_a_copy_of_the_migrated_template(
    airflow_db: Path, bare_database_url: str
) -> None:
    with psycopg.connect(bare_database_url, autocommit=True) as conn:
        dbname = conn.info.dbname
        conn.execute(f"COMMENT ON DATABASE {dbname} IS 'the checkout'")
    said: list[str] = []
    migrate_airflow_metadata(
        {**os.environ, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": bare_database_url}, said.append
    )

    template = f"{TEMPLATE_PREFIX}{airflow_migrations_head()}"
    assert said[-1] == f"Airflow's metadata database is a copy of {template}", said
    assert airflow_metadata_current(bare_database_url)
    assert airflow_metadata_current(bare_database_url.rsplit("/", 1)[0] + "/" + template)
    with psycopg.connect(bare_database_url) as conn:
        # Airflow's tables, empty as a migration leaves them, and the database's comment kept
        assert conn.execute("SELECT count(*) FROM dag").fetchone() == (0,)
        assert conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s", (dbname,)
        ).fetchone() == ("the checkout",)
        # no staged copy left behind
        assert conn.execute(
            "SELECT count(*) FROM pg_database WHERE starts_with(datname, %s)", (f"{dbname[:40]}_copy_",)
        ).fetchone() == (0,)
