"""The SQL shipped in the package: numbered migrations and named queries, read with importlib.resources.

The files live in the repository's ``sql/`` directory, which the wheel installs as the package
``retry_scheduler.db.sql``; Python passes parameters and never formats SQL.
"""

from __future__ import annotations

import logging
import re
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import LiteralString, cast

from psycopg import sql

from retry_scheduler.db.connection import StoreError, connect

log = logging.getLogger(__name__)

SQL_PACKAGE = "retry_scheduler.db.sql"
_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
# Any fixed number: serialises concurrent "db migrate" runs.
_MIGRATE_LOCK = 7_311_917_042


def sql_files() -> Traversable:
    """The directory of the shipped SQL (``sql/`` of the repository)."""
    return resources.files(SQL_PACKAGE)


def parse_named_queries(
    text: str, origin: str, into: dict[str, LiteralString] | None = None
) -> dict[str, LiteralString]:
    """The ``-- name: NAME`` blocks of *text*; a name defined twice is an error naming *origin*."""
    found: dict[str, LiteralString] = {} if into is None else into
    for block in re.split(r"^-- name: ", text, flags=re.MULTILINE)[1:]:
        name, _, body = block.partition("\n")
        if name.strip() in found:
            raise StoreError(f"query {name.strip()} is defined twice (second time in {origin})")
        found[name.strip()] = cast(LiteralString, body.strip().rstrip(";"))
    return found


@cache
def queries() -> dict[str, LiteralString]:
    """Named queries of every shipped ``*.sql`` file (``-- name:`` blocks), loaded once."""
    found: dict[str, LiteralString] = {}
    for entry in sorted(sql_files().iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            parse_named_queries(entry.read_text(encoding="utf-8"), entry.name, found)
    return found


def q(name: str) -> sql.SQL:
    """The named query *name* as a psycopg ``SQL`` object."""
    return sql.SQL(queries()[name])


def migration_files() -> list[tuple[int, str, Traversable]]:
    """The shipped migrations as ``(version, name, file)``, in order.

    Raises :class:`StoreError` when there are none: an installation without its SQL must fail
    loudly rather than report an up-to-date schema it never created.
    """
    try:
        entries = list(sql_files().joinpath("migrations").iterdir())
    except (FileNotFoundError, ModuleNotFoundError, NotADirectoryError):
        entries = []
    found = []
    for entry in sorted(entries, key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        match = _MIGRATION_NAME.match(entry.name)
        if not match:
            raise StoreError(f"migration file {entry.name} must be named NNNN_name.sql")
        found.append((int(match.group(1)), entry.name.removesuffix(".sql"), entry))
    if not found:
        raise StoreError(
            f"no migrations found in the package {SQL_PACKAGE}: the installation is incomplete, reinstall "
            "kafka-retry-scheduler (pip install --force-reinstall kafka-retry-scheduler)"
        )
    return found


def migrate(database_url: str) -> list[str]:
    """Apply the migrations not yet applied, in order, each in its own transaction.

    Idempotent and safe to run concurrently; returns the names of the migrations applied now.
    """
    applied_now: list[str] = []
    migrations = migration_files()
    # Migrations wait for each other's lock and may rewrite large tables: no statement limit.
    with connect(database_url, autocommit=True, statement_timeout=0) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATE_LOCK,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS retry_schema_version ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            rows = conn.execute("SELECT version FROM retry_schema_version").fetchall()
            done = {r[0] for r in rows}
            for version, name, path in migrations:
                if version in done:
                    continue
                with conn.transaction():
                    conn.execute(cast(LiteralString, path.read_text(encoding="utf-8")))
                    conn.execute(
                        "INSERT INTO retry_schema_version (version, name) VALUES (%s, %s)", (version, name)
                    )
                log.info("applied migration %s", name)
                applied_now.append(name)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATE_LOCK,))
    return applied_now
