"""The test suite's databases kept per checkout: a CI clone beside a working copy never shares them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from retry_scheduler.dev.postgres import dev_mark
from tests.conftest import ADMIN_URL, ROOT, _db_url, checkout_database, checkout_db_name


def _databases(prefix: str) -> dict[str, str | None]:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database "
            "WHERE starts_with(datname, %s)",
            (prefix,),
        ).fetchall()
    return dict(rows)


@pytest.fixture
def prefix() -> Iterator[str]:
    prefix = f"retry_checkout_{uuid.uuid4().hex[:6]}_"
    yield prefix
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        for name in _databases(prefix):
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_created_once_for_this_checkout_and_gone_checkouts_are_dropped(prefix: str, tmp_path: Path) -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        for suffix, checkout in (("gone", tmp_path / "deleted-clone"), ("other", tmp_path)):
            name = sql.Identifier(prefix + suffix)
            conn.execute(sql.SQL("CREATE DATABASE {}").format(name))
            conn.execute(
                sql.SQL("COMMENT ON DATABASE {} IS {}").format(name, sql.Literal(dev_mark(checkout)))
            )

    name = checkout_database(prefix)

    assert name == checkout_db_name(prefix)
    assert _databases(prefix) == {name: dev_mark(ROOT), prefix + "other": dev_mark(tmp_path)}
    with psycopg.connect(_db_url(name), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int)")
    assert checkout_database(prefix) == name  # again: the same database, not a new one
    with psycopg.connect(_db_url(name)) as conn:
        assert conn.execute("SELECT count(*) FROM kept").fetchone() == (0,)
