"""The dev broker's jars: Apache Kafka 4.4 from Maven Central, fetched once by Maven into a cache.

The versions are pinned in ``dev/kafka/pom.xml`` (Kafka and a log4j2 backend). The jars are never
shipped in the wheel: ``retry-scheduler dev kafka-deps`` (``make kafka-deps``) copies them into
``$RETRY_KAFKA_LIBS`` or ``~/.cache/kafka-retry-scheduler/kafka-4.4.0-<pom hash>/``, and the dev
stack, the demo and the tests fetch them on first use. Concurrent fetches (test workers) take turns.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

from retry_scheduler.dev.procs import DevStackError, Say

KAFKA_VERSION = "4.4.0"
#: Written last into a complete copy: a fetch that was killed half-way is fetched again.
COMPLETE = ".complete"


def pom_text() -> str:
    return files("retry_scheduler.dev").joinpath("kafka/pom.xml").read_text()


def libs_dir() -> Path:
    """Where the jars are (or will be): ``RETRY_KAFKA_LIBS``, else a cache named by the pom's content,
    so a change of a pinned version fetches anew instead of mixing two versions' jars."""
    if setting := os.environ.get("RETRY_KAFKA_LIBS"):
        return Path(setting).expanduser().resolve()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(pom_text().encode()).hexdigest()[:10]
    return cache / "kafka-retry-scheduler" / f"kafka-{KAFKA_VERSION}-{digest}"


def libs_complete(path: Path | None = None) -> bool:
    return ((path or libs_dir()) / COMPLETE).is_file()


@contextlib.contextmanager
def take_turns(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (made if missing) while the block runs: processes that
    fetch or build into the same cache (test workers) take turns."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def fetch_kafka_libs(say: Say = print) -> Path:
    """The folder of the broker's jars, fetched by Maven from Maven Central when not there yet."""
    target = libs_dir()
    if libs_complete(target):
        return target
    with take_turns(target.with_name(target.name + ".lock")):
        if libs_complete(target):  # another process fetched them while this one waited
            return target
        mvn = shutil.which("mvn")
        if mvn is None:
            raise DevStackError(
                f"The dev broker (Apache Kafka {KAFKA_VERSION}) is fetched from Maven Central by Maven, "
                "and mvn is not installed: apt-get install maven (or put the jars in RETRY_KAFKA_LIBS)"
            )
        say(f"Fetching Apache Kafka {KAFKA_VERSION} from Maven Central into {target} (once, about 45 MB)")
        with tempfile.TemporaryDirectory(prefix="kafka-pom-") as scratch:
            pom = Path(scratch) / "pom.xml"
            pom.write_text(pom_text())
            partial = target.with_name(target.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            command = [
                mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
                "-DincludeScope=runtime", f"-DoutputDirectory={partial}",
            ]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, cwd=scratch)
            if done.returncode != 0 or not any(partial.glob("kafka_2.13-*.jar")):
                shutil.rmtree(partial, ignore_errors=True)
                output = (done.stdout + done.stderr).strip().splitlines()[-25:]
                raise DevStackError(
                    f"Maven could not fetch Apache Kafka {KAFKA_VERSION} (exit {done.returncode}); is "
                    "Maven Central reachable (or a mirror in ~/.m2/settings.xml)? Maven said:\n"
                    + "\n".join(output)
                )
        (partial / COMPLETE).write_text(KAFKA_VERSION + "\n")
        shutil.rmtree(target, ignore_errors=True)
        partial.replace(target)
    return target
