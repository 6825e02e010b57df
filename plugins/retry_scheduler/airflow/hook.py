"""The hook that owns the service's Airflow connections: ``retry_postgres`` and ``retry_kafka``.

Connections are read when a task runs (or the page is asked), never when a DAG file is parsed.
``retry_postgres`` gives the database (host, port, login, password, schema, and libpq settings in its
extra: ``sslmode``, ``sslrootcert``, ``options``...); ``retry_kafka`` gives librdkafka's settings in
its extra, as the Kafka provider reads them. An undefined connection falls back to the environment
(``RETRY_DATABASE_URL``, ``KAFKA_BOOTSTRAP_SERVERS``) and the log says so.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from retry_scheduler.core.config import POLICIES_FILE, Settings

log = logging.getLogger(__name__)

POSTGRES_CONN_ID = "retry_postgres"
KAFKA_CONN_ID = "retry_kafka"
#: libpq connection parameters a ``retry_postgres`` extra may carry into the URL.
LIBPQ_EXTRAS = frozenset(
    {
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "sslpassword",
        "sslcrl",
        "options",
        "application_name",
        "connect_timeout",
        "target_session_attrs",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "gssencmode",
        "channel_binding",
    }
)


def postgres_url(
    host: str,
    port: int,
    user: str | None,
    password: str | None,
    dbname: str | None,
    params: dict[str, Any] | None = None,
) -> str:
    """A ``postgresql://`` URL (what psycopg and the Spark jobs take) from connection fields.

    ``host`` may name several servers, a primary and its replicas (``pg-a,pg-b:5433``): each without
    a port of its own gets ``port``. With ``target_session_attrs=read-write`` in the extra, the
    service connects to whichever of them is the primary (docs/operations/production-kafka.md)."""
    auth = ""
    if user:
        auth = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "") + "@"
    # quote, not quote_plus: libpq reads "+" as a plus sign, not a space ("-c statement_timeout=5s")
    query = f"?{urlencode({k: str(v) for k, v in sorted(params.items())}, quote_via=quote)}" if params else ""
    hosts = ",".join(_with_port(one.strip(), port) for one in host.split(","))
    return f"postgresql://{auth}{hosts}/{quote(dbname or 'retry_scheduler', safe='')}{query}"


def _with_port(host: str, port: int) -> str:
    """``host:port`` unless ``host`` gives its own port (``pg-b:5433``, ``[::1]:5433``); an IPv6
    address is bracketed."""
    if re.fullmatch(r"\[[^\]]*\]:\d+|[^:\[\]]+:\d+", host):
        return host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def _extra(conn: Any) -> dict[str, Any]:
    raw = getattr(conn, "extra", None)
    if not raw:
        return {}
    try:
        extra = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except ValueError:
        raise ValueError(f"connection {conn.conn_id}: its extra is not a JSON object") from None
    if not isinstance(extra, dict):
        raise ValueError(f"connection {conn.conn_id}: its extra is not a JSON object")
    return extra


def connection_url(conn: Any) -> str:
    """The database URL of a ``retry_postgres``-style connection, with its libpq extras.

    Unknown extra keys are an error naming them: a misspelt ``sslmode`` must not silently connect
    without TLS.
    """
    extra = _extra(conn)
    unknown = sorted(set(extra) - LIBPQ_EXTRAS)
    if unknown:
        raise ValueError(
            f"connection {conn.conn_id}: extra key(s) {', '.join(unknown)} are not libpq settings "
            f"(known: {', '.join(sorted(LIBPQ_EXTRAS))})"
        )
    return postgres_url(
        conn.host or "127.0.0.1", conn.port or 5432, conn.login, conn.password, conn.schema, extra
    )


class RetrySchedulerHook:
    """The service's settings from its Airflow connections, on top of the environment's.

    Not a ``BaseHook`` subclass on purpose: the Dead letters page runs in the api-server, where
    connections are read through ``Connection.get_connection_from_secrets``, and the tasks in
    workers, through the Task SDK; this class picks the right one.
    """

    conn_name_attr = "postgres_conn_id"
    default_conn_name = POSTGRES_CONN_ID

    def __init__(
        self,
        postgres_conn_id: str = POSTGRES_CONN_ID,
        kafka_conn_id: str = KAFKA_CONN_ID,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        """``environment``: settings of this deployment by their environment variables' names
        (``RETRY_TOPIC``...), over the process's own (a DAG factory's ``settings``)."""
        self.postgres_conn_id = postgres_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.environment = dict(environment or {})

    def database_url(self, *, in_task: bool = True) -> str | None:
        """The ``retry_postgres`` URL; None when the connection is not defined."""
        if in_task:
            from airflow.sdk import BaseHook
            from airflow.sdk.exceptions import AirflowNotFoundException

            get = BaseHook.get_connection
        else:
            from airflow.exceptions import AirflowNotFoundException
            from airflow.models.connection import Connection

            get = Connection.get_connection_from_secrets
        try:
            conn = get(self.postgres_conn_id)
        except AirflowNotFoundException:
            log.info("connection %s is not defined: using RETRY_DATABASE_URL", self.postgres_conn_id)
            return None
        return connection_url(conn)

    def kafka_config(self) -> dict[str, Any] | None:
        """librdkafka settings of ``retry_kafka`` (its extra); None when the connection is not defined."""
        from airflow.sdk import BaseHook
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            conn = BaseHook.get_connection(self.kafka_conn_id)
        except AirflowNotFoundException:
            log.info("connection %s is not defined: using KAFKA_BOOTSTRAP_SERVERS", self.kafka_conn_id)
            return None
        config = conn.extra_dejson
        if not isinstance(config, dict) or not config.get("bootstrap.servers"):
            raise ValueError(
                f"connection {self.kafka_conn_id}: its extra must be a JSON object of librdkafka "
                'settings with "bootstrap.servers", e.g. {"bootstrap.servers": "broker:9092"}'
            )
        return dict(config)

    def settings(self) -> Settings:
        """Settings from the environment, with the database and Kafka of the connections when defined.

        The policies module, unless ``RETRY_POLICIES`` names one, is ``retry_policies.py`` in the DAGs
        folder of Airflow's configuration when there is one there.
        """
        settings = Settings.from_env({**os.environ, **self.environment})
        changes: dict[str, Any] = {}
        if (url := self.database_url()) is not None:
            changes["database_url"] = url
        if (kafka := self.kafka_config()) is not None:
            changes["kafka"] = kafka
        return with_airflow_policies(settings.with_overrides(**changes))


def with_airflow_policies(settings: Settings) -> Settings:
    """``settings`` with the policies module beside Airflow's DAGs folder, unless ``RETRY_POLICIES`` names one.

    The DAGs folder as Airflow's configuration has it (``airflow.cfg`` too, not only the
    environment); usable outside tasks (the api-server's page).
    """
    if settings.policies_path:
        return settings
    from airflow.configuration import conf

    beside_dags = Path(conf.get("core", "dags_folder")).expanduser() / POLICIES_FILE
    if beside_dags.is_file():
        return settings.with_overrides(policies_path=str(beside_dags))
    return settings.with_overrides(policies_searched=(str(beside_dags.absolute()),))


def settings_from_connections(
    postgres_conn_id: str = POSTGRES_CONN_ID, kafka_conn_id: str = KAFKA_CONN_ID
) -> Settings:
    """Shorthand for ``RetrySchedulerHook(postgres_conn_id, kafka_conn_id).settings()``."""
    return RetrySchedulerHook(postgres_conn_id, kafka_conn_id).settings()
