"""What a Spark cluster's executors need to run the jobs' Python code, shipped by Spark itself.

With ``local[*]`` the executors live in the driver's JVM and their Python workers run the driver's
Python, with its packages. On a cluster (``spark://``, YARN, Kubernetes) they run elsewhere, from
a Spark installation that knows nothing of this project. So a job submitted to a cluster ships:

- **the Python packages** its Python workers import (``retry_scheduler`` and confluent-kafka,
  psycopg, pyarrow with what they require) as one archive, ``--archives ARCHIVE#retry_deps``:
  every executor unpacks it in its working directory, and ``spark.executorEnv.PYTHONPATH`` puts
  it on its Python workers' path. :func:`executor_archive` packs it from the driver's own
  environment (the same versions, the same binary builds); ``RETRY_SPARK_EXECUTOR_ARCHIVE`` names
  a prebuilt one instead, e.g. on ``hdfs://`` or ``s3a://`` where every node can read it.
- **the Python to run them with**: ``RETRY_SPARK_EXECUTOR_PYTHON`` (``spark.pyspark.python``),
  by default ``python3.X`` of the driver's minor version, which every executor host must have
  (the binary packages are built for it). The driver keeps its own Python
  (``spark.pyspark.driver.python``).
- **the PostgreSQL JDBC driver**, by ``--jars`` or ``--packages`` (:mod:`retry_scheduler.spark.jdbc`).

Nothing relies on the executors sharing the driver's checkout or virtual environment.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from retry_scheduler.core.setting_values import ConfigError

log = logging.getLogger(__name__)

#: The name executors unpack the archive under, in their working directory.
ALIAS = "retry_deps"
#: What the jobs' Python workers import, besides ``retry_scheduler`` and pyspark (Spark ships that).
EXECUTOR_DISTRIBUTIONS = ("confluent-kafka", "psycopg", "psycopg-binary", "pyarrow")
ARCHIVE_ENV = "RETRY_SPARK_EXECUTOR_ARCHIVE"
PYTHON_ENV = "RETRY_SPARK_EXECUTOR_PYTHON"


def is_local(master: str) -> bool:
    """Whether ``master`` runs the executors inside the driver (``local``, ``local[4]``, ``local[*]``)."""
    return master == "local" or master.startswith("local[")


#: ``RETRY_SPARK_LOCAL_NICE``: the niceness a local-mode job runs at (0: as the caller).
LOCAL_NICE_ENV = "RETRY_SPARK_LOCAL_NICE"
LOCAL_NICE_DEFAULT = 10


def local_nice() -> int:
    """How much lower a local-mode job's CPU priority is than its caller's (``RETRY_SPARK_LOCAL_NICE``,
    default 10, 0 to 19). A local job's driver, executors and Python workers share the machine's cores
    with the retry loops, whose retries are due to the second; a bulk retry or a compaction has no
    such deadline, so it takes what the loops leave (Linux gives a process at niceness 10 about a tenth
    of the CPU of one at 0 when both want it). On a cluster the executors run elsewhere: nothing changes."""
    text = os.environ.get(LOCAL_NICE_ENV, "").strip()
    if not text:
        return LOCAL_NICE_DEFAULT
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{LOCAL_NICE_ENV}={text!r}: give a niceness from 0 to 19 (0: no change)") from None
    if not 0 <= value <= 19:
        raise ConfigError(f"{LOCAL_NICE_ENV}={value}: give a niceness from 0 to 19 (0: no change)")
    return value


def niced_if_local(master: str, argv: list[str]) -> list[str]:
    """``argv`` (a spark-submit command) run at :func:`local_nice` when ``master`` is local, through
    ``nice``; as it is on a cluster, with niceness 0, or where there is no ``nice``."""
    step = local_nice()
    nice = shutil.which("nice")
    if not is_local(master) or not step or nice is None:
        return argv
    return [nice, "-n", str(step), *argv]


def executor_python() -> str:
    """The Python executors run the jobs' Python workers with (``RETRY_SPARK_EXECUTOR_PYTHON``)."""
    return os.environ.get(PYTHON_ENV) or f"python{sys.version_info.major}.{sys.version_info.minor}"


def _closure(names: Iterable[str]) -> list[metadata.Distribution]:
    """The installed distributions ``names`` and everything they require (their extras left out)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise FileNotFoundError(
                f"{name} is not installed beside this Python: install the project with its spark extra"
            ) from None
        seen[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(seen.values(), key=lambda d: d.metadata["Name"].lower())


def _package_files() -> Iterator[tuple[Path, str]]:
    """(file on disk, name in the archive) of ``retry_scheduler`` and the executors' distributions."""
    import retry_scheduler

    root = Path(retry_scheduler.__file__).resolve().parent
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            yield path, f"retry_scheduler/{path.relative_to(root).as_posix()}"
    if not (root / "db" / "sql").is_dir():
        # A checkout (editable install): the SQL the executors read (the bulk retry's mark) is the
        # repository's sql/, which a wheel installs as retry_scheduler/db/sql.
        from retry_scheduler.db.schema import sql_files

        sql_root = Path(str(sql_files()))
        for path in sorted(sql_root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                yield path, f"retry_scheduler/db/sql/{path.relative_to(sql_root).as_posix()}"
    for dist in _closure(EXECUTOR_DISTRIBUTIONS):
        for entry in dist.files or []:
            name = entry.as_posix()
            if name.startswith("..") or "__pycache__" in name or name.endswith(".pyc"):
                continue  # scripts outside site-packages; bytecode is compiled where it runs
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                yield path, name


def _digest(files: list[tuple[Path, str]]) -> str:
    digest = hashlib.sha256(f"{sys.version_info[:2]}".encode())
    for path, name in files:
        stat = path.stat()
        digest.update(f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def executor_archive(directory: Path) -> Path:
    """The archive of the executors' Python packages in ``directory``, packed unless already there.

    Named after a digest of its files (names, sizes, times) and the Python version, so a change to
    the project or an upgraded package makes a new one; written to a temporary name and renamed.
    """
    files = list(_package_files())
    target = directory / f"executor-deps-{_digest(files)}.tar.gz"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    log.info("packing the executors' Python packages (%s files) into %s", len(files), target)
    with tempfile.NamedTemporaryFile(dir=directory, suffix=".part", delete=False) as tmp:
        try:
            with tarfile.open(fileobj=tmp, mode="w:gz", compresslevel=1) as tar:
                for path, name in files:
                    tar.add(path, arcname=name, recursive=False)
        except BaseException:
            Path(tmp.name).unlink(missing_ok=True)
            raise
    os.replace(tmp.name, target)
    return target


def cluster_submit(master: str, directory: Path) -> tuple[str | None, dict[str, str]]:
    """spark-submit's ``--archives`` and ``--conf`` for ``master``: none for a local master.

    The archive is ``RETRY_SPARK_EXECUTOR_ARCHIVE`` when set, else packed in ``directory``.
    """
    if is_local(master):
        return None, {}
    archive = os.environ.get(ARCHIVE_ENV) or str(executor_archive(directory))
    return f"{archive}#{ALIAS}", {
        "spark.executorEnv.PYTHONPATH": ALIAS,
        "spark.pyspark.python": executor_python(),
        "spark.pyspark.driver.python": sys.executable,
    }
