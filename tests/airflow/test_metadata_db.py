"""The dev stack leaves ``airflow db migrate`` out only when the metadata database is at the installed
Airflow's newest migration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

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

    # What the stack runs when it is not current brings it there.
    env = {**os.environ, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": bare_database_url}
    airflow = str(Path(sys.executable).parent / "airflow")
    with psycopg.connect(bare_database_url, autocommit=True) as conn:
        conn.execute("DROP TABLE alembic_version")
    subprocess.run([airflow, "db", "migrate"], check=True, env=env, capture_output=True)
    assert airflow_metadata_current(bare_database_url)
