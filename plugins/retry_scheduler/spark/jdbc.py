"""How the PySpark jobs reach PostgreSQL over JDBC: the URL and properties, jars, fetch sizes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from getpass import getuser
from typing import LiteralString
from urllib.parse import parse_qsl, quote, unquote, urlsplit


class JobArgumentError(ValueError):
    """A bulk-retry or compaction argument is invalid; the message names it."""


#: Debian's libpostgresql-jdbc-java; on a cluster set RETRY_SPARK_PACKAGES instead.
DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"
#: What one JDBC round trip of a Spark job may hold, per reading task.
FETCH_BYTES = 64 * 2**20
#: Rows per JDBC round trip when rows are small: fewer round trips gain little beyond this.
MAX_FETCH_ROWS = 10_000
#: A job row's columns besides key, value and headers (ids, topics, reason, times), about.
ROW_OVERHEAD_BYTES = 512
#: SQL of a job row's payload: key, value and pass-through headers, each up to the record limit.
PAYLOAD_BYTES_SQL: LiteralString = (
    "coalesce(octet_length(msg_key), 0) + coalesce(octet_length(msg_value), 0) "
    "+ coalesce(octet_length(headers), 0)"
)


def fetch_rows(max_payload_bytes: int | None) -> int:
    """Rows per JDBC round trip (``fetchsize``) for rows whose largest payload is ``max_payload_bytes``.

    10 000 small rows per round trip, fewer as rows grow, so that one fetch holds at most
    ``FETCH_BYTES`` (64 MiB): a selection of 1 MiB records fetches 63 rows at a time instead of
    10 GiB that the Spark executor could not hold.
    """
    row_bytes = ROW_OVERHEAD_BYTES + max(0, max_payload_bytes or 0)
    return max(1, min(MAX_FETCH_ROWS, FETCH_BYTES // row_bytes))


JDBC_DRIVER = "org.postgresql.Driver"
#: libpq URL parameters JDBC understands, and their JDBC names.
_JDBC_PARAMS = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "application_name": "ApplicationName",
    "connect_timeout": "connectTimeout",
}

#: pgjdbc sends a one-off query's rows as text (``bytea`` as hex, times as strings it parses) and
#: switches to binary only for a statement run five times; ``-1`` makes every statement binary.
#: A million job rows read in 2.7 s instead of 3.9 s (bench/README.md).
BINARY_TRANSFER = {"prepareThreshold": "-1"}


@dataclass(frozen=True)
class JdbcTarget:
    """How the Spark jobs reach the retry database over JDBC."""

    url: str
    properties: dict[str, str]

    def connection_properties(self) -> dict[str, str]:
        """Driver and credentials, for ``DataFrameWriter.jdbc(url, table, properties=...)``."""
        return {"driver": JDBC_DRIVER, **self.properties}

    def options(self) -> dict[str, str]:
        """Everything ``spark.read.format("jdbc").options(...)`` needs to connect."""
        return {"url": self.url, **self.connection_properties()}


def jdbc_target(database_url: str) -> JdbcTarget:
    """Turn a libpq URL (``postgresql://user:pw@host:port/db?sslmode=...``) into a JDBC URL and properties."""
    parts = urlsplit(database_url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise JobArgumentError(
            "the database URL must be a postgresql:// URL (RETRY_DATABASE_URL, the retry_postgres connection)"
        )
    query = dict(parse_qsl(parts.query))
    unsupported = sorted(set(query) - set(_JDBC_PARAMS) - {"user", "password"})
    if unsupported:
        raise JobArgumentError(
            f"database URL parameter(s) {', '.join(unsupported)} have no JDBC equivalent here "
            f"(supported: {', '.join(sorted(_JDBC_PARAMS))}, user, password)"
        )
    try:
        port = parts.port or 5432
    except ValueError:
        raise JobArgumentError("the database URL has an invalid port") from None
    host = parts.hostname
    if not host:
        raise JobArgumentError("the database URL needs a host: JDBC cannot connect through a Unix socket")
    user = unquote(parts.username) if parts.username else query.get("user") or getuser()
    password = unquote(parts.password) if parts.password is not None else query.get("password")
    dbname = unquote(parts.path.lstrip("/")) or user
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    properties = {"user": user, **BINARY_TRANSFER}
    if password is not None:
        properties["password"] = password
    properties |= {_JDBC_PARAMS[k]: v for k, v in query.items() if k in _JDBC_PARAMS}
    return JdbcTarget(f"jdbc:postgresql://{netloc}/{quote(dbname, safe='')}", properties)


def jdbc_jars() -> str | None:
    """Jars for ``spark-submit --jars`` (the PostgreSQL JDBC driver), unless packages are used."""
    if os.environ.get("RETRY_SPARK_PACKAGES"):
        return None
    return os.environ.get("RETRY_SPARK_JARS", DEFAULT_JDBC_JAR)


def spark_packages() -> str | None:
    """Maven coordinates for ``spark-submit --packages`` on a cluster, e.g. ``org.postgresql:postgresql:42.7.4``."""
    return os.environ.get("RETRY_SPARK_PACKAGES") or None
