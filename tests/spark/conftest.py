"""Spark fixtures: one ``local[2]`` SparkSession for the whole test session, with the PostgreSQL JDBC driver.

The machine is shared with other test runs: two cores and four shuffle partitions are plenty for the
small frames and tables the Spark tests use.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Debian's libpostgresql-jdbc-java; override with RETRY_TEST_JDBC_JAR.
JDBC_JAR = Path(os.environ.get("RETRY_TEST_JDBC_JAR", "/usr/share/java/postgresql.jar"))


@pytest.fixture(scope="session")
def jdbc_jar() -> str:
    """Path of the PostgreSQL JDBC driver jar (fails with what to install when it is missing)."""
    if not JDBC_JAR.is_file():
        pytest.fail(
            f"PostgreSQL JDBC driver not found at {JDBC_JAR}: apt-get install libpostgresql-jdbc-java "
            "or set RETRY_TEST_JDBC_JAR"
        )
    return str(JDBC_JAR)


@pytest.fixture(scope="session")
def spark(jdbc_jar: str) -> Iterator[SparkSession]:
    """One SparkSession for every Spark test: local[2], 4 shuffle partitions, UTC, no UI.

    Its driver maps the class archive ``make spark-deps`` wrote, as every job the service submits
    does (``spark_conf``): each test worker that runs a Spark test starts a driver JVM of its own.
    """
    from pyspark.sql import SparkSession

    from retry_scheduler.spark.submit import spark_conf

    # Python workers (if a test needs any) run the venv's interpreter, not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    for key, value in spark_conf().items():
        builder = builder.config(key, value)
    session = (
        builder.master("local[2]")
        .appName("retry-scheduler-tests")
        .config("spark.jars", jdbc_jar)
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    # py4j says "Closing down clientserver connection" (INFO) from a finaliser at interpreter exit,
    # after pytest has closed the streams a handler may still point at: a "Logging error" in the output.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    yield session
    session.stop()
    # The JVM (py4j's gateway) would otherwise live until this process exits: stop it with the session,
    # so the suite's teardown finds no process of its own left (tests/conftest.py).
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        proc = getattr(gateway, "proc", None)
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        SparkContext._gateway = None
        SparkContext._jvm = None
