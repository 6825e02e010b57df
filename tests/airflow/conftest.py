"""Airflow test environment: a throwaway AIRFLOW_HOME and a PostgreSQL metadata database.

The environment is set before Airflow is imported, so its configuration picks it up.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from retry_scheduler.dev.airflow_env import migrate_airflow_metadata
from tests.conftest import ROOT, WORKER, _db_url, checkout_database, checkout_db_name

#: One per checkout, and per pytest-xdist worker.
AIRFLOW_HOME = ROOT / (f".airflow-test-{WORKER}" if WORKER else ".airflow-test")
#: One metadata database per checkout, as AIRFLOW_HOME is, kept between runs.
AIRFLOW_DB_PREFIX = "retry_airflow_test_"
AIRFLOW_DB = checkout_db_name(AIRFLOW_DB_PREFIX)

os.environ.update(
    {
        "AIRFLOW_HOME": str(AIRFLOW_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        # The plugin loads by its entry point: the plugins folder holds nothing.
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(AIRFLOW_HOME / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": _db_url(AIRFLOW_DB).replace(
            "postgresql://", "postgresql+psycopg2://"
        ),
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    }
)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """This checkout's (and worker's) Airflow metadata database (``checkout_database``), migrated
    unless it is already at the installed Airflow's newest migration."""
    AIRFLOW_HOME.mkdir(exist_ok=True)
    checkout_database(AIRFLOW_DB_PREFIX)
    migrate_airflow_metadata(os.environ.copy())
    return AIRFLOW_HOME


@pytest.fixture(autouse=True)
def _metadata_db(airflow_db: Path) -> None:
    """Every test here may touch the metadata database (``DagBag.get_dag`` reads ``DagModel``): it
    exists, migrated, whichever test a worker runs first (random order included)."""
