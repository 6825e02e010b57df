"""Handing the connections to a child process without putting them on its command line.

A command line is readable by every user of the machine (``ps``, ``/proc/PID/cmdline``) and task
logs print it; a password there leaks. The parent (``retry-scheduler bulk-retry|compact``, the Spark
DAGs' operator) writes the database URL and the librdkafka settings to a file only its own user can
read (mode 0600, in a fresh directory of mode 0700), passes the child the file's *path*
(``--connection-file``), and deletes it when the child is done. The file also says where the
deployment's policies module is and what ``RETRY_DESTINATION_ALLOWLIST`` adds, as the parent
resolved them: a job checks destinations too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from retry_scheduler.core.config import Settings
from retry_scheduler.core.setting_values import ConfigError, checked_kafka_config

#: The job option that names the file.
CONNECTION_FILE_OPTION = "--connection-file"


@contextmanager
def connection_file(settings: Settings) -> Iterator[Path]:
    """Write ``settings``' database URL and Kafka settings to a private file; delete it on exit."""
    directory = Path(tempfile.mkdtemp(prefix="retry-scheduler-"))  # mode 0700
    path = directory / "connections.json"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(
                {
                    "database_url": settings.database_url,
                    "kafka": settings.kafka,
                    # Where the job finds the deployment's destination rules, as the parent resolved them.
                    "policies_path": ",".join(str(p) for p in settings.policies_files),
                    "destination_allowlist": settings.destination_allowlist,
                },
                out,
            )
        yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def read_connection_file(path: str | Path, settings: Settings) -> Settings:
    """``settings`` with the database and Kafka of the file at ``path``.

    Refuses a file that other users can read or write: it holds passwords. Errors name the file and
    what is wrong with it, never its content.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"{path} is readable by other users: it holds passwords (chmod 600 it)")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the connection file {path}: {exc.strerror}") from None
    try:
        content = json.loads(text)
    except ValueError:
        content = None
    if not isinstance(content, dict) or not isinstance(content.get("database_url"), str):
        raise ConfigError(
            f'{path} must be a JSON object like {{"database_url": "postgresql://...", "kafka": {{}}}}'
        )
    kafka = checked_kafka_config(content.get("kafka") or {}, f"{path}: kafka")
    changes: dict[str, Any] = {"database_url": content["database_url"], "kafka": {**settings.kafka, **kafka}}
    for name in ("policies_path", "destination_allowlist"):
        if isinstance(content.get(name), str):
            changes[name] = content[name]
    return settings.with_overrides(**changes)


def add_connection_options(parser: argparse.ArgumentParser, *, kafka: bool = True) -> None:
    """The options by which a job learns its connections: a connection file, or the environment."""
    parser.add_argument(
        CONNECTION_FILE_OPTION,
        metavar="PATH",
        help="JSON file (mode 0600) with the database URL and librdkafka settings, as written by "
        "retry-scheduler and the DAGs; without it: RETRY_DATABASE_URL, KAFKA_BOOTSTRAP_SERVERS and "
        "RETRY_KAFKA_CONFIG from the environment (never a password on the command line)",
    )
    if kafka:
        parser.add_argument("--bootstrap-servers", metavar="HOST:PORT", help="Kafka, instead of the file's")


def job_settings(args: argparse.Namespace) -> Settings:
    """The settings of a job: the environment's, then the connection file's, then ``--bootstrap-servers``."""
    settings = Settings.from_env()
    if args.connection_file:
        settings = read_connection_file(args.connection_file, settings)
    if getattr(args, "bootstrap_servers", None):
        settings = settings.with_overrides(
            kafka={**settings.kafka, "bootstrap.servers": args.bootstrap_servers}
        )
    return settings
