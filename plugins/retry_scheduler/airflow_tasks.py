"""The Airflow side: settings from connections, and the bodies of the ``retry_scheduler`` tasks.

DAG files stay thin and call these. Connections are read at run time, never at parse time:
``retry_postgres`` (PostgreSQL) and ``retry_kafka`` (librdkafka settings in its extra). When a
connection is not defined, the environment (``RETRY_DATABASE_URL``, ``KAFKA_BOOTSTRAP_SERVERS``)
is used and the log says so.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

from retry_scheduler.config import Settings
from retry_scheduler.ingest import Ingestor
from retry_scheduler.policy import load_policies
from retry_scheduler.publish import Publisher
from retry_scheduler.store import Store

log = logging.getLogger(__name__)

POSTGRES_CONN_ID = "retry_postgres"
KAFKA_CONN_ID = "retry_kafka"


def postgres_url(host: str, port: int, user: str | None, password: str | None, dbname: str | None) -> str:
    """A ``postgresql://`` URL (what psycopg and the Spark jobs take) from connection fields."""
    auth = ""
    if user:
        auth = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "") + "@"
    return f"postgresql://{auth}{host}:{port}/{quote(dbname or 'retry_scheduler', safe='')}"


def settings_from_connections(
    postgres_conn_id: str = POSTGRES_CONN_ID, kafka_conn_id: str = KAFKA_CONN_ID
) -> Settings:
    """Settings from the environment, with the database and Kafka taken from Airflow connections."""
    from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    settings = Settings.from_env()
    changes: dict[str, Any] = {}
    try:
        conn = BaseHook.get_connection(postgres_conn_id)
        changes["database_url"] = postgres_url(
            conn.host or "127.0.0.1", conn.port or 5432, conn.login, conn.password, conn.schema
        )
    except AirflowNotFoundException:
        log.info("connection %s is not defined: using RETRY_DATABASE_URL", postgres_conn_id)
    try:
        changes["kafka"] = KafkaBaseHook(kafka_config_id=kafka_conn_id)._build_config()
    except AirflowNotFoundException:
        log.info("connection %s is not defined: using KAFKA_BOOTSTRAP_SERVERS", kafka_conn_id)
    return settings.with_overrides(**changes)


def run_ingest(loop_seconds: float, settings: Settings | None = None) -> dict[str, Any]:
    """Ingest the retry topics for ``loop_seconds``; returns the counts (pushed as XCom)."""
    settings = settings or settings_from_connections()
    registry = load_policies(settings.policies_path)
    with Store(settings.database_url) as store:
        ingestor = Ingestor(settings, registry, store)
        try:
            counts = ingestor.run(loop_seconds)
        finally:
            ingestor.close()
    result = counts.as_dict()
    log.info("ingest run: %s", result)
    return result


def run_publish(loop_seconds: float, settings: Settings | None = None) -> dict[str, Any]:
    """Publish due and dead jobs for ``loop_seconds``; returns the counts (pushed as XCom)."""
    settings = settings or settings_from_connections()
    with Store(settings.database_url) as store:
        publisher = Publisher(settings, store)
        try:
            counts = publisher.run(loop_seconds)
        finally:
            publisher.close()
        result = counts.as_dict()
        late = store.status(window_s=int(loop_seconds) + 60)["lateness"]
        result["lateness_p99_s"] = late.p99_s
        result["early"] = late.early
    log.info("publish run: %s", result)
    return result


def run_dlq_operation(params: dict[str, Any], actor: str | None, run_id: str | None) -> dict[str, Any]:
    """The ``dlq_replay`` DAG's task: replay or purge the dead jobs of the form's filter, audited.

    ``actor`` is the Airflow user who triggered the run (recorded in ``retry_dlq_audit``).
    """
    from retry_scheduler.dlq import DlqFilter, run_action

    settings = settings_from_connections()
    flt = DlqFilter.from_params(params)
    action = params.get("action", "replay")
    dry_run = bool(params.get("dry_run", True))

    def progress(done: int, total: int) -> None:
        log.info("%s: %d of %d jobs done", action, done, total)

    outcome = run_action(
        settings.database_url,
        action,
        flt,
        actor=actor or "airflow",
        source="dag",
        dry_run=dry_run,
        reset_attempts=bool(params.get("reset_attempts", False)),
        run_id=run_id,
        progress=progress,
    )
    log.info("%s", outcome.summary())
    if dry_run and outcome.would_affect:
        log.info("nothing was changed: trigger again with dry_run unticked to %s these jobs", action)
    return outcome.as_json()
