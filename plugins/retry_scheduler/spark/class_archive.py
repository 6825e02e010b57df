"""The Spark driver's class-data sharing archive: where it is, whether it is whole, which are stale."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from retry_scheduler.core.config import dev_home

log = logging.getLogger(__name__)


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
    try:
        spark_version = version("pyspark")
    except PackageNotFoundError:  # only the Spark provider's pyspark-client: no local Spark to archive
        return None
    binary = Path(java).resolve()
    key = f"{binary}:{binary.stat().st_mtime_ns}:pyspark-{spark_version}"
    return dev_home() / "spark" / f"{_ARCHIVE_PREFIX}{hashlib.sha1(key.encode()).hexdigest()[:12]}.jsa"


_ARCHIVE_PREFIX = "driver-classes-"


def _class_archive_setting() -> str:
    return os.environ.get("RETRY_SPARK_CLASS_ARCHIVE", "").strip()


def stale_class_archives(archive: Path) -> list[Path]:
    """Archives and notes of an earlier JDK or Spark beside the default ``archive`` (none for a named one)."""
    if _class_archive_setting():
        return []
    return [path for path in archive.parent.glob(f"{_ARCHIVE_PREFIX}*") if path.stem != archive.stem]


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
