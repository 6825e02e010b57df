"""Submitting the PySpark jobs of ``include/spark/``: their arguments, from Airflow or the CLI.

The jobs run with plain ``spark-submit``; this module only builds their command lines, so the
Airflow DAGs (``SparkSubmitOperator``) and ``retry-scheduler bulk-retry|compact`` run the very
same code with the same arguments.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from getpass import getuser
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any, LiteralString
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from retry_scheduler.config import REPO_ROOT, Settings
from retry_scheduler.durations import parse_duration_ms

if TYPE_CHECKING:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

log = logging.getLogger(__name__)

SPARK_DIR = REPO_ROOT / "include" / "spark"
BULK_RETRY_APP = SPARK_DIR / "bulk_retry.py"
COMPACT_APP = SPARK_DIR / "compact.py"
WARM_UP_APP = SPARK_DIR / "warm_up.py"
#: Debian's libpostgresql-jdbc-java; on a cluster set RETRY_SPARK_PACKAGES instead.
DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"
DEFAULT_ARCHIVE = (REPO_ROOT / ".dev" / "archive").as_uri()
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
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


class JobArgumentError(ValueError):
    """A bulk-retry or compaction argument is invalid; the message names it."""


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
        raise JobArgumentError("--database-url must be a postgresql:// URL")
    query = dict(parse_qsl(parts.query))
    unsupported = sorted(set(query) - set(_JDBC_PARAMS) - {"user", "password"})
    if unsupported:
        raise JobArgumentError(
            f"--database-url parameter(s) {', '.join(unsupported)} have no JDBC equivalent here "
            f"(supported: {', '.join(sorted(_JDBC_PARAMS))}, user, password)"
        )
    try:
        port = parts.port or 5432
    except ValueError:
        raise JobArgumentError("--database-url has an invalid port") from None
    host = parts.hostname
    if not host:
        raise JobArgumentError("--database-url needs a host: JDBC cannot connect through a Unix socket")
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


def class_archive() -> Path | None:
    """Where the Spark driver JVM's class-data sharing archive of this machine is, or would be.

    ``RETRY_SPARK_CLASS_ARCHIVE`` names the file, or turns the archive off (``off``). By default it
    lives in ``.dev/spark/`` under a name that changes with the ``java`` binary and the PySpark
    version, so that a JDK or Spark upgrade never maps an archive of other classes (the JVM checks
    too, and ignores a mismatched one).
    """
    setting = _class_archive_setting()
    if setting.lower() in ("off", "0", "false", "no"):
        return None
    if setting:
        return Path(setting).expanduser()
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if java is None or not Path(java).exists():
        return None
    binary = Path(java).resolve()
    key = f"{binary}:{binary.stat().st_mtime_ns}:pyspark-{version('pyspark')}"
    return (
        REPO_ROOT / ".dev" / "spark" / f"{_ARCHIVE_PREFIX}{hashlib.sha1(key.encode()).hexdigest()[:12]}.jsa"
    )


_ARCHIVE_PREFIX = "driver-classes-"


def _class_archive_setting() -> str:
    return os.environ.get("RETRY_SPARK_CLASS_ARCHIVE", "").strip()


def stale_class_archives(archive: Path) -> list[Path]:
    """Archives and notes of an earlier JDK or Spark beside the default ``archive`` (none for a named one)."""
    if _class_archive_setting():
        return []
    return [path for path in archive.parent.glob(f"{_ARCHIVE_PREFIX}*") if path.stem != archive.stem]


def spark_conf() -> dict[str, str]:
    """``--conf`` of every job submission: the driver maps the class archive when there is one.

    ``retry-scheduler dev spark-archive`` (run by ``make spark-deps``) writes the archive; it cuts
    about a third of a job's start-up (bench/README.md). Set as ``spark.driver.defaultJavaOptions``,
    so that ``spark.driver.extraJavaOptions`` stays the user's; a JVM that cannot use the archive
    (another JDK, another class path) warns and starts without it.
    """
    archive = class_archive()
    if archive is None or not archive_complete(archive):
        return {}
    return {"spark.driver.defaultJavaOptions": f"-XX:SharedArchiveFile={archive}"}


def spark_submit_operator(
    *, task_id: str, application: Path, name: str, application_args: Any
) -> SparkSubmitOperator:
    """The ``SparkSubmitOperator`` of a retry-scheduler DAG, with what every job submission takes.

    The ``spark_default`` connection says where to submit; the JDBC driver (``jdbc_jars``) or
    ``RETRY_SPARK_PACKAGES``, and the class archive of ``make spark-deps`` (``spark_conf``), are
    added as ``retry-scheduler bulk-retry|compact`` adds them. ``application_args`` may be an
    XComArg, resolved at run time.
    """
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    return SparkSubmitOperator(
        task_id=task_id,
        application=str(application),
        conn_id="spark_default",
        jars=jdbc_jars(),
        conf=spark_conf(),
        packages=spark_packages(),
        name=name,
        application_args=application_args,
    )


def archive_complete(archive: Path) -> bool:
    """Whether ``archive`` is there, whole: as many bytes as its note (``.json`` beside it) says.

    A JVM that maps a truncated archive dies of SIGBUS, so a damaged one is never passed on; a
    missing one would turn off the JDK's own class sharing too.
    """
    try:
        size = archive.stat().st_size
        note = json.loads(archive.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return False
    expected = note.get("bytes") if isinstance(note, dict) else None
    if expected == size:
        return True
    log.warning(
        "Spark class archive %s has %s bytes, %s expected: not used; run `retry-scheduler dev spark-archive "
        "--force`", archive, size, expected,
    )  # fmt: skip
    return False


def archive_uri() -> str:
    return os.environ.get("RETRY_ARCHIVE_URI") or DEFAULT_ARCHIVE


def _iso(name: str, value: Any) -> str | None:
    if value in (None, ""):
        return None
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise JobArgumentError(
            f"{name}={value!r} is not an ISO-8601 time like 2026-11-21T10:00:00Z"
        ) from None
    return parsed.isoformat()


def _connection_args(settings: Settings) -> list[str]:
    extra = {k: v for k, v in settings.kafka.items() if k != "bootstrap.servers"}
    args = ["--database-url", settings.database_url, "--bootstrap-servers", settings.bootstrap_servers]
    if extra:
        args += ["--kafka-config", json.dumps(extra)]
    return args


def bulk_retry_args(params: Mapping[str, Any], settings: Settings) -> list[str]:
    """Validate the bulk-retry filters and return the job's arguments."""
    args = _connection_args(settings)
    destination = params.get("destination") or None
    if destination is not None:
        if not _TOPIC.fullmatch(str(destination)):
            raise JobArgumentError(f"destination {destination!r} is not a valid topic name")
        args += ["--destination", str(destination)]
    status = params.get("status") or "dead"
    if status not in ("dead", "pending"):
        raise JobArgumentError(f"status {status!r} must be dead or pending")
    args += ["--status", status]
    if params.get("error_class"):
        args += ["--error-class", str(params["error_class"])]
    since, until = _iso("since", params.get("since")), _iso("until", params.get("until"))
    if since and until and datetime.fromisoformat(since) >= datetime.fromisoformat(until):
        raise JobArgumentError(f"since ({since}) must be before until ({until})")
    args += ["--since", since] if since else []
    args += ["--until", until] if until else []
    limit = params.get("limit")
    if limit not in (None, "", 0):
        if int(limit) < 0:
            raise JobArgumentError(f"limit {limit} must be positive")
        args += ["--limit", str(int(limit))]
    if params.get("dry_run", True):
        args.append("--dry-run")
    return args


def compact_args(
    settings: Settings,
    *,
    day: str | None = None,
    older_than: str | None = None,
    archive: str | None = None,
    dead_retention: str = "30d",
    dry_run: bool = False,
) -> list[str]:
    """Arguments of the compaction job: one UTC ``day`` (the DAG) or everything ``older_than``."""
    if (day is None) == (older_than is None):
        raise JobArgumentError("give exactly one of day or older_than")
    for name, value in (("older_than", older_than), ("dead_retention", dead_retention)):
        if value is not None:
            try:
                parse_duration_ms(value)
            except ValueError as exc:
                raise JobArgumentError(f"{name}: {exc}") from None
    args = ["--database-url", settings.database_url, "--archive", archive or archive_uri()]
    if day is not None:
        try:
            datetime.strptime(day, "%Y-%m-%d")
        except ValueError:
            raise JobArgumentError(f"day {day!r} must look like 2026-11-21") from None
        args += ["--day", day]
    else:
        args += ["--older-than", str(older_than)]
    args += ["--dead-retention", dead_retention]
    if dry_run:
        args.append("--dry-run")
    return args
