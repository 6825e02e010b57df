"""Every row the row builder makes is one PostgreSQL stores: the property test of row building, at the sink.

The unit property test (``tests/unit/test_rows_property.py``) checks what the builder returns; this one
sends each generated record's row to a real database with the ingest loop's own COPY, without the
fallback that replaces a refused row (a refusal fails the test), and reads it back: key, value and
headers byte for byte, the reason of an invalid record, a pending or a dead status.
"""

from __future__ import annotations

import itertools

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings

from retry_scheduler.core import protocol as p
from retry_scheduler.core.jobs import decode_headers
from retry_scheduler.db.store import Store
from tests.unit.test_rows_property import build_any, check_storable, records

pytestmark = pytest.mark.integration


def test_every_built_row_is_stored_as_built(database_url: str) -> None:
    offsets = itertools.count()
    with Store(database_url) as store, psycopg.connect(database_url) as reader:

        @settings(
            max_examples=300,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(**records)
        def stored_as_built(
            ts: int | None, key: bytes | None, value: bytes | None, hs: list | None, topic: str
        ) -> None:
            row = build_any(ts, key, value, hs, topic)
            if row is None:
                return  # a release record: it stores no job
            check_storable(row)
            row = row._replace(source_offset=next(offsets))
            assert store.queue.insert_rows([row]) == [row.dead_reason]  # stored, not refused, not skipped
            got = reader.execute(
                "SELECT msg_key, msg_value, headers, status::text, dead_reason, reason, retry_id, destination "
                "FROM retry_jobs_all WHERE source_topic = %s AND source_offset = %s",
                (row.source_topic, row.source_offset),
            ).fetchone()
            reader.rollback()
            assert got is not None
            assert (got[0], got[1], got[3], got[4]) == (key, value, row.status, row.dead_reason)
            assert bytes(got[2]) == row.headers and (got[5], got[6], got[7]) == (
                row.reason,
                row.retry_id,
                row.destination,
            )
            if row.dead_reason == p.DEAD_INVALID:
                assert decode_headers(got[2]) == list(hs or [])  # the record as it came

        stored_as_built()
