"""Every service connection limits how long a statement may run (RETRY_STATEMENT_TIMEOUT_MS)."""

from __future__ import annotations

import psycopg
import pytest

from retry_scheduler.db.connection import StoreError, connect
from retry_scheduler.db.schema import migrate
from retry_scheduler.db.store import Store

pytestmark = pytest.mark.integration


def test_a_statement_running_past_the_limit_is_cancelled(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RETRY_STATEMENT_TIMEOUT_MS", "300")
    with Store(database_url) as store:
        assert store.conn.execute("SHOW statement_timeout").fetchone() == ("300ms",)
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            store.conn.execute("SELECT pg_sleep(2)")
    monkeypatch.delenv("RETRY_STATEMENT_TIMEOUT_MS")
    with connect(database_url) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("5min",)  # the default


def test_migrations_are_not_limited(bare_database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRY_STATEMENT_TIMEOUT_MS", "1")
    assert migrate(bare_database_url)  # would be cancelled at once if the limit applied


def test_a_wrong_limit_says_what_it_must_be(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRY_STATEMENT_TIMEOUT_MS", "soon")
    with pytest.raises(
        StoreError, match="RETRY_STATEMENT_TIMEOUT_MS='soon' must be a number of milliseconds"
    ):
        connect(database_url)
