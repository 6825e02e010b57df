"""The benchmark's own SQL (``bench/bench.sql``): filling and measuring tables, never shipped."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import LiteralString

from psycopg import sql

from retry_scheduler.db.schema import parse_named_queries

BENCH_SQL = Path(__file__).with_name("bench.sql")


@cache
def bench_queries() -> dict[str, LiteralString]:
    """The named queries of ``bench/bench.sql``, loaded once."""
    return parse_named_queries(BENCH_SQL.read_text(encoding="utf-8"), BENCH_SQL.name)


def bq(name: str) -> sql.SQL:
    """The benchmark's named query *name*."""
    return sql.SQL(bench_queries()[name])
