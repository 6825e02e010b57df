"""How the PySpark jobs reach PostgreSQL over JDBC: the URL and properties, jars, fetch sizes."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from getpass import getuser
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from retry_scheduler.db.connection import statement_timeout_ms

log = logging.getLogger(__name__)


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


def fetch_rows(max_payload_bytes: int | None) -> int:
    """Rows per JDBC round trip (``fetchsize``) for rows whose largest payload is ``max_payload_bytes``.

    10 000 small rows per round trip, fewer as rows grow, so that one fetch holds at most
    ``FETCH_BYTES`` (64 MiB): a selection of 1 MiB records fetches 63 rows at a time instead of
    10 GiB that the Spark executor could not hold.
    """
    row_bytes = ROW_OVERHEAD_BYTES + max(0, max_payload_bytes or 0)
    return max(1, min(MAX_FETCH_ROWS, FETCH_BYTES // row_bytes))


JDBC_DRIVER = "org.postgresql.Driver"
#: libpq URL parameters pgjdbc understands under another name (or the same), with the same values.
_JDBC_PARAMS = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "sslpassword": "sslpassword",
    "application_name": "ApplicationName",
    "connect_timeout": "connectTimeout",
    "options": "options",
    "gssencmode": "gssEncMode",
}
#: libpq's ``target_session_attrs`` as pgjdbc's ``targetServerType``.
_TARGET_SERVER_TYPES = {
    "any": "any",
    "read-write": "primary",
    "primary": "primary",
    "read-only": "secondary",
    "standby": "secondary",
    "prefer-standby": "preferSecondary",
}
#: libpq's keep-alive timing: pgjdbc only turns keep-alives on (``tcpKeepAlive``); the timing is the OS's.
_KEEPALIVE_TIMING = ("keepalives_idle", "keepalives_interval", "keepalives_count")
#: What pgjdbc cannot do, and what to do instead. Refused: left out, they would weaken the connection.
_REFUSED = {
    "sslcrl": "pgjdbc cannot check a certificate revocation list; leave sslcrl out of the connection the Spark "
    "jobs use, or check revocation in the JVM's trust store (-Dcom.sun.net.ssl.checkRevocation=true)",
    "sslcrldir": "pgjdbc cannot check a certificate revocation list directory; leave sslcrldir out of the "
    "connection the Spark jobs use",
    "channel_binding": "pgjdbc here cannot be made to require channel binding; use channel_binding=prefer "
    "(or disable), or leave it out of the connection the Spark jobs use",
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


def jdbc_target(database_url: str, statement_timeout: int | None = None) -> JdbcTarget:
    """Turn a libpq URL (``postgresql://user:pw@host:port/db?sslmode=...``) into a JDBC URL and properties.

    A URL naming several servers (``host1:5432,host2:5432``, a primary and its replica) names them all
    in the JDBC URL too; with ``target_session_attrs=read-write`` pgjdbc connects to the primary
    among them (``targetServerType=primary``), as libpq does.

    Every libpq parameter the Airflow hook accepts works here too, under its pgjdbc name
    (``options``, ``target_session_attrs``, ``sslpassword``, ``gssencmode``, ``keepalives``...); the
    ones pgjdbc cannot honour are refused with an error that says what to do, never dropped in
    silence. Every statement is cancelled after ``statement_timeout`` ms (default
    ``RETRY_STATEMENT_TIMEOUT_MS``; 0: never), sent as ``-c statement_timeout=...`` in ``options``
    after the connection's own."""
    parts = urlsplit(database_url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise JobArgumentError(
            "the database URL must be a postgresql:// URL (RETRY_DATABASE_URL, the retry_postgres connection)"
        )
    query = dict(parse_qsl(parts.query))
    properties = _jdbc_parameters(query)
    hosts = _hosts(parts.netloc.rpartition("@")[2])
    user = unquote(parts.username) if parts.username else query.get("user") or getuser()
    password = unquote(parts.password) if parts.password is not None else query.get("password")
    dbname = unquote(parts.path.lstrip("/")) or user
    netloc = ",".join(f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in hosts)
    properties = {"user": user, **BINARY_TRANSFER, **properties}
    if password is not None:
        properties["password"] = password
    limit = statement_timeout_ms() if statement_timeout is None else statement_timeout
    properties["options"] = " ".join(
        filter(None, [properties.get("options", "").strip(), f"-c statement_timeout={limit}"])
    )
    return JdbcTarget(f"jdbc:postgresql://{netloc}/{quote(dbname, safe='')}", properties)


def _hosts(hostlist: str) -> list[tuple[str, int]]:
    """The servers of a URL's host part: one ``host:port``, or libpq's several,
    ``host1:port1,host2:port2`` (a primary and its replicas), each port 5432 when left out."""
    hosts = []
    for entry in hostlist.split(","):
        host, port = entry, ""
        if entry.startswith("["):  # an IPv6 address: [::1]:5432
            host, _, rest = entry[1:].partition("]")
            port = rest.removeprefix(":")
        elif ":" in entry:
            host, _, port = entry.rpartition(":")
        if not host:
            raise JobArgumentError("the database URL needs a host: JDBC cannot connect through a Unix socket")
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise JobArgumentError("the database URL has an invalid port")
        hosts.append((unquote(host), int(port or 5432)))
    return hosts


def _jdbc_parameters(query: dict[str, str]) -> dict[str, str]:
    """The pgjdbc properties of a libpq URL's parameters (``user`` and ``password`` excepted)."""
    properties = {_JDBC_PARAMS[k]: v for k, v in query.items() if k in _JDBC_PARAMS}
    for name in sorted(set(query) & set(_REFUSED)):
        if name == "channel_binding" and query[name] in ("disable", "prefer"):
            continue  # what pgjdbc does without being asked
        raise JobArgumentError(f"database URL parameter {name}={query[name]!r}: {_REFUSED[name]}")
    if "target_session_attrs" in query:
        attrs = query["target_session_attrs"]
        if attrs not in _TARGET_SERVER_TYPES:
            raise JobArgumentError(
                f"database URL parameter target_session_attrs={attrs!r} must be one of "
                f"{', '.join(_TARGET_SERVER_TYPES)}"
            )
        properties["targetServerType"] = _TARGET_SERVER_TYPES[attrs]
    if "keepalives" in query or any(k in query for k in _KEEPALIVE_TIMING):
        properties["tcpKeepAlive"] = "false" if query.get("keepalives", "1").strip() == "0" else "true"
        timing = sorted(k for k in _KEEPALIVE_TIMING if k in query)
        if timing and properties["tcpKeepAlive"] == "true":
            log.warning(
                "%s: the Spark jobs' JDBC connections keep alive with the operating system's timing "
                "(pgjdbc has no such setting)", ", ".join(timing),
            )  # fmt: skip
    known = set(_JDBC_PARAMS) | set(_REFUSED) | set(_KEEPALIVE_TIMING)
    unsupported = sorted(set(query) - known - {"user", "password", "keepalives", "target_session_attrs"})
    if unsupported:
        raise JobArgumentError(
            f"database URL parameter(s) {', '.join(unsupported)} have no JDBC equivalent here (supported: "
            f"{', '.join(sorted({*_JDBC_PARAMS, *_KEEPALIVE_TIMING, 'keepalives', 'target_session_attrs'}))}, "
            "user, password)"
        )
    return properties


def jdbc_jars() -> str | None:
    """Jars for ``spark-submit --jars`` (the PostgreSQL JDBC driver), unless packages are used."""
    if os.environ.get("RETRY_SPARK_PACKAGES"):
        return None
    return os.environ.get("RETRY_SPARK_JARS", DEFAULT_JDBC_JAR)


def spark_packages() -> str | None:
    """Maven coordinates for ``spark-submit --packages`` on a cluster, e.g. ``org.postgresql:postgresql:42.7.4``."""
    return os.environ.get("RETRY_SPARK_PACKAGES") or None
