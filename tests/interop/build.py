"""The interop programs (``tests/interop/*/``): built by Maven once per machine, cached, started by tests.

Each module is a real application of a tool whose dead letters the service adopts (Spring Kafka,
Kafka Connect, Kafka Streams, a Java share consumer) or the Java example of the header protocol
document, compiled from the document's own code block. The whole folder (with that block put in)
is copied into ``~/.cache/kafka-retry-scheduler/interop-<hash of its content>/`` and built there with
``mvn package dependency:copy-dependencies``; a change of any file builds anew. Concurrent test
workers take turns; a build killed half-way is built again.

Without Java or Maven the tests that need them fail with the command that installs them: they are
never skipped silently.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from retry_scheduler.dev.kafka_libs import take_turns

HERE = Path(__file__).resolve().parent
DOCS = HERE.parents[1] / "docs" / "header-protocol.md"
MODULES = ("spring", "connect", "streams", "share", "docs-client")
#: Where the docs' example goes in DocsClient.java.
MARKER = "// DOCS_EXAMPLE"
#: The paragraph the docs' Java example follows.
DOCS_ANCHOR = "Java, with plain `ProducerRecord` headers"
COMPLETE = ".complete"


class InteropBuildError(RuntimeError):
    """The programs could not be built: what is missing and the command that installs it."""


def docs_java_example(text: str | None = None) -> str:
    """The code block that follows :data:`DOCS_ANCHOR` in the header protocol document."""
    text = DOCS.read_text() if text is None else text
    at = text.find(DOCS_ANCHOR)
    if at < 0:
        raise InteropBuildError(f"{DOCS} no longer has the paragraph {DOCS_ANCHOR!r}")
    block = re.search(r"```java\n(.*?)```", text[at:], re.S)
    if block is None:
        raise InteropBuildError(f"no ```java block follows {DOCS_ANCHOR!r} in {DOCS}")
    return block.group(1)


def _sources() -> list[Path]:
    return sorted(
        p
        for p in HERE.rglob("*")
        if p.is_file() and "target" not in p.parts and p.suffix in {".java", ".xml"}
    )


def cache_dir() -> Path:
    """Named by the content of every source and pom, and of the docs' example."""
    digest = hashlib.sha256()
    for path in _sources():
        digest.update(str(path.relative_to(HERE)).encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(docs_java_example().encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "kafka-retry-scheduler" / f"interop-{digest.hexdigest()[:12]}"


def _need(tool: str, package: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise InteropBuildError(
            f"the interop tests run real Java applications and need {tool}: apt-get install {package}"
        )
    return found


def build() -> Path:
    """The built copy of the programs (built now when it is not there yet)."""
    target = cache_dir()
    if (target / COMPLETE).is_file():
        return target
    _need("javac", "openjdk-17-jdk-headless")
    mvn = _need("mvn", "maven")
    with take_turns(target.with_name(target.name + ".lock")):
        if (target / COMPLETE).is_file():
            return target
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        for path in _sources():
            copy = partial / path.relative_to(HERE)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy)
        client = partial / "docs-client/src/main/java/interop/DocsClient.java"
        source = client.read_text()
        if MARKER not in source:
            raise InteropBuildError(f"{MARKER} is missing from DocsClient.java")
        client.write_text(source.replace(MARKER, docs_java_example()))
        command = [mvn, "-q", "-B", "-f", str(partial / "pom.xml"), "package",
                   "dependency:copy-dependencies", "-DincludeScope=runtime"]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, cwd=partial)
        if done.returncode != 0:
            output = (done.stdout + done.stderr).strip().splitlines()[-40:]
            raise InteropBuildError(
                f"Maven could not build the interop programs (exit {done.returncode}); is Maven Central "
                "reachable (or a mirror in ~/.m2/settings.xml)? Maven said:\n" + "\n".join(output)
            )
        (partial / COMPLETE).write_text("built\n")
        shutil.rmtree(target, ignore_errors=True)
        partial.replace(target)
    return target


def java(module: str, main: str, *args: str, heap_mb: int = 256) -> list[str]:
    """The command that runs ``interop.<main>`` (or a class named in full) of ``module``, built first
    if need be."""
    if module not in MODULES:
        raise ValueError(f"no interop module {module!r}: {MODULES}")
    root = build() / module / "target"
    classpath = f"{root / 'classes'}{os.pathsep}{root / 'dependency'}/*"
    return [
        _need("java", "openjdk-17-jdk-headless"), f"-Xmx{heap_mb}m", "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp", classpath, main if "." in main else f"interop.{main}", *args,
    ]  # fmt: skip
