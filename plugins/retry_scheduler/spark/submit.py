"""Submitting the PySpark jobs: their command lines and arguments, from Airflow or the CLI.

The jobs (``include/spark/`` of the repository, installed as ``retry_scheduler.spark.jobs``) run
with plain ``spark-submit``; this module builds their command lines, so the Airflow DAGs
(``SparkSubmitOperator``) and ``retry-scheduler bulk-retry|compact`` run the very same code with
the same arguments.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

from retry_scheduler.core.config import Settings, dev_home
from retry_scheduler.core.durations import parse_duration_ms
from retry_scheduler.spark.class_archive import archive_complete, class_archive
from retry_scheduler.spark.connection_file import CONNECTION_FILE_OPTION, connection_file
from retry_scheduler.spark.executor_env import cluster_submit, niced_if_local
from retry_scheduler.spark.jdbc import JobArgumentError, jdbc_jars, spark_packages

JOBS_PACKAGE = "retry_scheduler.spark.jobs"


def job_file(name: str) -> Path:
    """The file of the PySpark job *name* (``bulk_retry.py``), as installed with the package."""
    return Path(str(resources.files(JOBS_PACKAGE).joinpath(name)))


BULK_RETRY_APP = job_file("bulk_retry.py")
COMPACT_APP = job_file("compact.py")
WARM_UP_APP = job_file("warm_up.py")


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


def archive_uri() -> str:
    """Where compaction writes Parquet: ``RETRY_ARCHIVE_URI``, else ``archive/`` of the dev home."""
    return os.environ.get("RETRY_ARCHIVE_URI") or (dev_home() / "archive").as_uri()


def bulk_retry_args(params: Mapping[str, Any], settings: Settings | None = None) -> list[str]:
    """Validate a bulk retry's selection (a form's or a command line's values, the names of
    :class:`~retry_scheduler.db.selection.Selection`) and its options; return the job's arguments.

    ``settings``: the deployment's, to find the topics of ``written_by``. The arguments hold no
    connection: the job reads those from the connection file :func:`run_spark_submit` (or the DAGs'
    operator) hands it, never from its command line.
    """
    from retry_scheduler.core.rates import RateError, parse_rate
    from retry_scheduler.db.selection import Selection

    args = Selection.from_params(params, settings).as_args()
    mark_batch = params.get("mark_batch")
    if mark_batch not in (None, ""):
        if not 1 <= int(mark_batch) <= 1_000_000:
            raise JobArgumentError(f"mark_batch {mark_batch} must be between 1 and 1000000")
        args += ["--mark-batch", str(int(mark_batch))]
    try:
        rate = parse_rate(params.get("rate"))
    except RateError as exc:
        raise JobArgumentError(str(exc)) from None
    if rate:
        args += ["--rate", f"{rate:g}"]
    if params.get("dry_run", True):
        args.append("--dry-run")
    return args


def dag_audit_args(actor: str | None, run_id: str) -> list[str]:
    """The bulk retry's audit arguments for a DAG run: who triggered it, and the run's id.

    The job's run id allows ``[A-Za-z0-9._:-]``: other characters of Airflow's run id become ``_``.
    """
    name = (actor or "airflow")[:200]
    return ["--actor", name, "--source", "dag", "--run-id", job_run_id(run_id)]


def job_run_id(run_id: str) -> str:
    """The bulk retry job's run id for an Airflow run id (as its audit row records it)."""
    return re.sub(r"[^A-Za-z0-9._:-]", "_", run_id)[:128] or "dag"


def compact_args(
    *,
    day: str | None = None,
    older_than: str | None = None,
    archive: str | None = None,
    dead_retention: str = "30d",
    dry_run: bool = False,
    delete_batch: int | None = None,
) -> list[str]:
    """Arguments of the compaction job: one UTC ``day`` (the DAG) or everything ``older_than``.

    No connection among them, as for :func:`bulk_retry_args`.
    """
    if (day is None) == (older_than is None):
        raise JobArgumentError("give exactly one of day or older_than")
    for name, value in (("older_than", older_than), ("dead_retention", dead_retention)):
        if value is not None:
            try:
                parse_duration_ms(value)
            except ValueError as exc:
                raise JobArgumentError(f"{name}: {exc}") from None
    args = ["--archive", archive or archive_uri()]
    if day is not None:
        try:
            datetime.strptime(day, "%Y-%m-%d")
        except ValueError:
            raise JobArgumentError(f"day {day!r} must look like 2026-11-21") from None
        args += ["--day", day]
    else:
        args += ["--older-than", str(older_than)]
    args += ["--dead-retention", dead_retention]
    if delete_batch is not None:
        if delete_batch < 1:
            raise JobArgumentError(f"delete_batch {delete_batch} must be positive")
        args += ["--delete-batch", str(delete_batch)]
    if dry_run:
        args.append("--dry-run")
    return args


def spark_master(master: str | None = None) -> str:
    """Where jobs run: ``master``, else ``RETRY_SPARK_MASTER``, else ``local[*]`` (this machine)."""
    return master or os.environ.get("RETRY_SPARK_MASTER") or "local[*]"


def run_spark_submit(
    app: Path | str,
    job_args: list[str],
    settings: Settings | None = None,
    conf: dict[str, str] | None = None,
    master: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    show: Callable[[dict[str, Any]], None] | None = None,
) -> int:
    """Run a PySpark job with the ``spark-submit`` beside this Python; return its exit status.

    The master is :func:`spark_master`; on a cluster the executors get their Python packages by
    ``--archives`` (:mod:`retry_scheduler.spark.executor_env`), the JDBC driver by ``--jars`` (or
    ``--packages``), and the driver runs here (client mode). Given ``settings``, the job reads
    their database and Kafka from a private connection file (``--connection-file``, see
    :mod:`retry_scheduler.spark.connection_file`), so no password is on any command line. The job's
    log goes to stderr live; its progress lines (:mod:`retry_scheduler.spark.progress`) go to
    ``progress(done, total)`` when given (else to stderr); its result, the last JSON object it
    prints, goes to ``show`` (else printed on stdout as it is). ``conf`` replaces the default
    ``--conf`` of every job (:func:`spark_conf`).
    """
    from retry_scheduler.spark import progress as job_progress

    spark_submit = Path(sys.executable).parent / "spark-submit"
    master = spark_master(master)
    archives, cluster_conf = cluster_submit(master, dev_home() / "spark")
    cmd = [
        str(spark_submit),
        "--master",
        master,
        "--conf",
        "spark.log.level=WARN",
    ]
    for key, value in {**(spark_conf() if conf is None else conf), **cluster_conf}.items():
        cmd += ["--conf", f"{key}={value}"]
    if archives:
        cmd += ["--archives", archives]
    if jars := jdbc_jars():
        cmd += ["--jars", jars]
    if packages := spark_packages():
        cmd += ["--packages", packages]
    env = dict(os.environ)
    # spark-submit finds Spark through this python; the job's Python workers use the same one,
    # which has this package installed.
    env["PATH"] = os.pathsep.join(filter(None, [str(spark_submit.parent), env.get("PATH")]))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    result: str | None = None
    with contextlib.ExitStack() as stack:
        argv = [*cmd, str(app), *job_args]
        if settings is not None:
            argv += [CONNECTION_FILE_OPTION, str(stack.enter_context(connection_file(settings)))]
        argv = niced_if_local(master, argv)
        with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("{") and _is_json_object(line):
                    result = line.strip()
                elif progress is not None and (step := job_progress.parse(line)) is not None:
                    progress(step[1], step[2])
                else:
                    sys.stderr.write(line)
    if result is not None:
        if show is None:
            print(result)
        else:
            show(json.loads(result))
    return proc.returncode


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
