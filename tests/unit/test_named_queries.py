"""Every named query can be sent as psycopg sends it: a literal ``%`` in a query with placeholders
must be doubled, or psycopg refuses the statement at run time ("incomplete placeholder"), and a
query without placeholders holds no ``%`` at all (sent with an empty dict, psycopg reads its
placeholders; sent with none, it does not: either way it must mean the same). A comment's "1 %" in ``mark_published`` once stopped every publish round of the demo."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from retry_scheduler.db.schema import parse_named_queries, queries

PLACEHOLDER = re.compile(r"%\(\w+\)s|%s")
BENCH_SQL = Path(__file__).resolve().parents[2] / "bench" / "bench.sql"


def _all() -> dict[str, str]:
    named = {f"sql/{name}": body for name, body in queries().items()}
    bench = parse_named_queries(BENCH_SQL.read_text(encoding="utf-8"), "bench.sql")
    named.update({f"bench/{name}": body for name, body in bench.items()})
    return named


def percent_problem(body: str) -> str | None:
    """What is wrong with the ``%`` of one query's text (comments included), or None."""
    if PLACEHOLDER.search(body):
        left = PLACEHOLDER.sub("", body).replace("%%", "")
        return "a lone % (write %%)" if "%" in left else None
    return "a % in a query without placeholders (sent with or without parameters)" if "%" in body else None


@pytest.mark.parametrize("name", sorted(_all()))
def test_every_percent_sign_reaches_the_server_as_written(name: str) -> None:
    assert percent_problem(_all()[name]) is None, name


def test_the_check_finds_what_psycopg_refuses() -> None:
    assert percent_problem("-- about 1 % of the work\nSELECT %(a)s") == "a lone % (write %%)"
    assert percent_problem("SELECT 'x%%' LIKE %(a)s") is None
    assert percent_problem("SELECT 'x' LIKE 'y'") is None
    for body in ("SELECT 'x%' LIKE 'y'", "SELECT 'x%%' LIKE 'y'"):
        assert (
            percent_problem(body) == "a % in a query without placeholders (sent with or without parameters)"
        )
