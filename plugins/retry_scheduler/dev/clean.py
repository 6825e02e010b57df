"""``retry-scheduler dev clean``: remove what the dev tooling created, and nothing else.

What ``make up``, ``make demo`` and ``dev postgres`` create: databases on the server of
``RETRY_DATABASE_URL`` (the dev stack's Airflow metadata database, the migrated template new ones are
copied from, the retry database when the dev tooling created it), each commented as made for this
dev home (:func:`retry_scheduler.dev.postgres.dev_mark`); and, in the dev home (``.dev``): Airflow's
home, the logs, the PostgreSQL cluster it started when none answered, and the Spark cluster's
work directories. Spark's class archive (``.dev/spark``, made by ``make spark-deps``) is kept unless
asked for. A database without the mark, or commented for another dev home, is never touched.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from retry_scheduler.core.config import libpq_url
from retry_scheduler.db.connection import redact_url
from retry_scheduler.dev.postgres import dev_mark
from retry_scheduler.dev.procs import DevStackError, Say

#: The dev home's folders ``dev clean`` removes; ``spark`` (the class archive) only with ``everything``.
FOLDERS = ("airflow", "logs", "postgres", "kafka", "spark-cluster", "archive")


@dataclass
class Plan:
    """What ``dev clean`` would remove."""

    databases: list[str] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)
    #: the PostgreSQL the dev tooling started from ``.dev/postgres``, still running (its pid)
    postmaster: int | None = None

    def empty(self) -> bool:
        return not self.databases and not self.folders


def plan(database_url: str, home: Path, *, everything: bool = False) -> Plan:
    """What was made for ``home``: its databases (if the server answers) and folders."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    found = Plan()
    try:
        with psycopg.connect(
            make_conninfo(libpq_url(database_url), dbname="postgres", connect_timeout=5)
        ) as conn:
            rows = conn.execute(
                "SELECT datname FROM pg_database WHERE shobj_description(oid, 'pg_database') = %s ORDER BY 1",
                (dev_mark(home),),
            ).fetchall()
            found.databases = [name for (name,) in rows]
    except psycopg.OperationalError:
        pass  # no server: nothing of it to drop (its cluster, if ours, is a folder below)
    names = (*FOLDERS, "spark") if everything else FOLDERS
    found.folders = [home / name for name in names if (home / name).exists()]
    found.postmaster = _running_postmaster(home / "postgres")
    return found


def _running_postmaster(data_dir: Path) -> int | None:
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def clean(database_url: str, home: Path, *, yes: bool, everything: bool = False, say: Say = print) -> Plan:
    """Remove what :func:`plan` finds; with ``yes`` false, only say what that is. A database someone
    is still connected to (a dev stack running) stops it all before anything is removed."""
    found = plan(database_url, home, everything=everything)
    if found.empty():
        say(f"Nothing to remove: no database made for {home} on {redact_url(database_url)}, no dev folder")
        return found
    for name in found.databases:
        say(f"{'dropping' if yes else 'would drop'} database {name} ({redact_url(database_url)})")
    for folder in found.folders:
        say(f"{'removing' if yes else 'would remove'} {folder}")
    if not yes:
        say("Nothing removed: add --yes to remove them")
        return found
    _drop(database_url, found.databases)
    if found.postmaster is not None and home / "postgres" in found.folders:
        _stop_postmaster(found.postmaster, say)
    for folder in found.folders:
        shutil.rmtree(folder, ignore_errors=False)
    say(f"Removed {len(found.databases)} database(s) and {len(found.folders)} folder(s)")
    return found


def _drop(database_url: str, names: list[str]) -> None:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    with psycopg.connect(
        make_conninfo(libpq_url(database_url), dbname="postgres", connect_timeout=5), autocommit=True
    ) as conn:
        busy = conn.execute(
            "SELECT datname, count(*) FROM pg_stat_activity WHERE datname = ANY(%s) AND pid <> pg_backend_pid()"
            " GROUP BY 1 ORDER BY 1",
            (names,),
        ).fetchall()
        if busy:
            shown = ", ".join(f"{name} ({count} connection(s))" for name, count in busy)
            raise DevStackError(
                f"In use: {shown}. Stop the dev stack (Ctrl-C in make up) or whatever else is connected, "
                "then run dev clean again; nothing was removed"
            )
        for name in names:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))


def _stop_postmaster(pid: int, say: Say) -> None:
    """Stop the PostgreSQL the dev tooling started (a fast shutdown), before its folder goes."""
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            say(f"stopped the dev PostgreSQL (pid {pid})")
            return
        time.sleep(0.2)
    raise DevStackError(
        f"the dev PostgreSQL (pid {pid}) did not stop within 30 s: stop it, then run dev clean again"
    )
