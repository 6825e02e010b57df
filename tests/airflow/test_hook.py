"""The service's connections, read the Airflow way: ``retry_postgres`` with its libpq extras, ``retry_kafka``.

The URL built from a connection is used against the real PostgreSQL: what its extras ask for
(``application_name``, ``options``) is what the server sees. The task path through the Task SDK is
exercised by every DAG test (``dag.test()``); here the api-server's path, which the Dead letters
page uses, reads the connection from the environment as Airflow's secrets backends do.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from retry_scheduler.airflow.hook import RetrySchedulerHook, connection_url, postgres_url

pytestmark = [pytest.mark.airflow, pytest.mark.integration]


def _connection(database_url: str, extra: dict) -> object:
    from airflow.models.connection import Connection

    parts = urlsplit(database_url)
    return Connection(
        conn_id="retry_postgres",
        conn_type="postgres",
        host=parts.hostname,
        port=parts.port,
        login=parts.username,
        schema=parts.path.lstrip("/"),
        extra=json.dumps(extra),
    )


def test_libpq_extras_reach_the_server(database_url: str) -> None:
    extra = {
        "application_name": "retry-hook-test",
        "options": "-c statement_timeout=4321",
        "sslmode": "disable",
    }
    url = connection_url(_connection(database_url, extra))
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT current_setting('application_name')").fetchone() == ("retry-hook-test",)
        assert conn.execute("SHOW statement_timeout").fetchone() == ("4321ms",)
        assert conn.execute("SELECT count(*) FROM retry_jobs_all").fetchone() == (0,)


def test_an_unknown_extra_key_is_an_error_that_names_it(database_url: str) -> None:
    with pytest.raises(ValueError, match=r"extra key\(s\) ssl_mode are not libpq settings"):
        connection_url(_connection(database_url, {"ssl_mode": "require"}))


def test_passwords_and_names_are_quoted() -> None:
    url = postgres_url("db", 5432, "svc", "p@ss/wo:rd", "retry jobs", {"sslmode": "verify-full"})
    assert url == "postgresql://svc:p%40ss%2Fwo%3Ard@db:5432/retry%20jobs?sslmode=verify-full"


def test_the_page_reads_the_connection_with_its_extras(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = urlsplit(database_url)
    monkeypatch.setenv(
        "AIRFLOW_CONN_RETRY_POSTGRES",
        json.dumps(
            {
                "conn_type": "postgres",
                "host": parts.hostname,
                "port": parts.port,
                "login": parts.username,
                "schema": parts.path.lstrip("/"),
                "extra": {"application_name": "retry-page-test"},
            }
        ),
    )
    from retry_scheduler.airflow.webui import access

    monkeypatch.setattr(access, "_url_cache", None)
    url = access.database_url()
    assert url == RetrySchedulerHook().database_url(in_task=False)
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT current_setting('application_name')").fetchone() == ("retry-page-test",)


def test_an_undefined_connection_falls_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_RETRY_POSTGRES", raising=False)
    assert RetrySchedulerHook(postgres_conn_id="retry_postgres_nowhere").database_url(in_task=False) is None


def test_policies_are_found_in_the_dags_folder_of_airflows_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DAGs folder set in airflow.cfg (not the environment) is where the policies module is looked for."""
    from airflow.configuration import conf

    dags = tmp_path / "my-dags"
    dags.mkdir()
    (dags / "retry_policies.py").write_text(
        "from retry_scheduler import Policy\n\nPOLICIES = [Policy('default', delays=['1s'], max_attempts=1)]\n"
    )
    monkeypatch.delenv("AIRFLOW__CORE__DAGS_FOLDER", raising=False)
    monkeypatch.delenv("RETRY_POLICIES", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_RETRY_POSTGRES", "postgresql://postgres@127.0.0.1:5432/retry_scheduler")
    monkeypatch.setenv(
        "AIRFLOW_CONN_RETRY_KAFKA",
        json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": "k:9092"}}),
    )
    previous = conf.get("core", "dags_folder")
    conf.set("core", "dags_folder", str(dags))
    try:
        settings = RetrySchedulerHook().settings()
    finally:
        conf.set("core", "dags_folder", previous)
    assert settings.policies_files == [dags / "retry_policies.py"]
    assert settings.bootstrap_servers == "k:9092"
