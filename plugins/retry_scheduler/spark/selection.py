"""What a bulk retry reads of its selection: the per-destination summary and the JDBC read.

The selection itself (:class:`~retry_scheduler.db.selection.Selection`) is the one the DLQ commands
and the page use; the bulk retry adds what it can publish: jobs with a destination and, of pending
ones, those neither leased by the publish loop nor held behind their chain. Destinations and globs
are inlined into the JDBC query (Spark's ``dbtable`` takes no parameters): every value passed the
selection's checks and is quoted by :func:`~retry_scheduler.db.selection.sql_literal`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, LiteralString

from retry_scheduler.core.destinations import Destinations
from retry_scheduler.core.jobs import Status
from retry_scheduler.core.protocol import DEAD_PARKED
from retry_scheduler.db.bulk_retry import open_breakers
from retry_scheduler.db.bulk_retry import summarize as db_summarize
from retry_scheduler.db.selection import Selection, SelectionError
from retry_scheduler.spark.jdbc import JdbcTarget

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

#: The columns an OutgoingRow is built from, named like its fields (same as the claim queries).
OUTGOING_COLUMNS: LiteralString = (
    "id, destination, destination_partition, msg_key AS key, msg_value AS value, headers, attempt, "
    "policy, reason, error_class, consumer_group, retry_id, original_topic, original_partition, "
    "original_offset, (extract(epoch FROM first_seen_at) * 1000)::bigint AS original_timestamp_ms, "
    "dead_reason, dlq_topic, held_by"
)
#: The id range a read is held to (:func:`jdbc_table`).
ID_RANGE: tuple[LiteralString, LiteralString] = ("id >= %(min_id)s", "id <= %(max_id)s")


class BulkRetryError(SelectionError):
    """A bulk retry cannot start: a filter, URL or setting is invalid or unreachable; the message says which."""


def publishable(selection: Selection) -> tuple[LiteralString, ...]:
    """What the bulk retry adds to a selection: the jobs of it that it can publish now."""
    # A job without a destination has nowhere to go back to (its record is on the DLQ).
    fragments: list[LiteralString] = ["destination IS NOT NULL"]
    if selection.status is Status.DEAD and not (selection.dead_reason == DEAD_PARKED or selection.ids):
        # A parked job (replayed that often, dead again each time) goes back only when asked for.
        fragments.append("dead_reason <> 'parked'")
    if selection.status is Status.PENDING:
        # A pending job backing off after a failed delivery is left to the publish loop. One the
        # publish loop is sending at this moment may go out twice, with the same retry.id and
        # attempt (at-least-once); the mark then finds it published already.
        fragments.append("(lease_until IS NULL OR lease_until < now())")
        # A held job waits for its chain (ordered mode): published now, it would overtake the
        # records before it. It goes when its chain is released.
        fragments.append("held_by IS NULL")
    return tuple(fragments)


def jdbc_table(selection: Selection, min_id: int, max_id: int) -> str:
    """The selection as a ``dbtable`` subquery with bound literals, held to the counted id range.

    The id range makes the read see what the driver counted (``--limit`` included) and not the
    jobs ingested since.
    """
    where = selection.jdbc_where(*publishable(selection), *ID_RANGE, min_id=min_id, max_id=max_id)
    return f"(SELECT {OUTGOING_COLUMNS} FROM retry_jobs WHERE {where}) AS bulk_retry_selection"


@dataclass(frozen=True)
class SelectionSummary:
    per_destination: dict[str, int]
    min_id: int | None
    max_id: int | None
    #: The largest key + value + headers of the selection, in bytes: sizes the JDBC fetches.
    max_payload_bytes: int = 0

    @property
    def count(self) -> int:
        return sum(self.per_destination.values())


def summarize(database_url: str, selection: Selection) -> SelectionSummary:
    """The selection's jobs the bulk retry can publish, per destination (:func:`publishable`)."""
    rows = db_summarize(database_url, selection, *publishable(selection))
    return SelectionSummary(
        per_destination={r[0]: r[1] for r in rows},
        min_id=min((r[2] for r in rows), default=None),
        max_id=max((r[3] for r in rows), default=None),
        max_payload_bytes=max((r[4] for r in rows), default=0),
    )


def left_alone(
    run_id: str, database_url: str, summary: SelectionSummary, destinations: Destinations
) -> tuple[dict[str, int], dict[str, int]]:
    """Of the selection's destinations, with how many jobs each: those not allowed (checked again here,
    not only at ingest: a destination taken off the list stays unpublished to), and those whose breaker
    (``BREAKERS``) is open or probing, left to the publish loop, which pauses them. Logged."""
    refused = {d: n for d, n in summary.per_destination.items() if not destinations.allows(d)}
    paused = {
        d: summary.per_destination[d] for d in open_breakers(database_url, list(summary.per_destination))
    }
    if refused:
        why = destinations.refusal(next(iter(refused)))
        log.warning("run %s leaves %s jobs as they are: their destinations are not allowed (%s)",
                    run_id, sum(refused.values()), why)  # fmt: skip
    if paused:
        log.warning("run %s leaves %s jobs as they are: the breakers of %s are open (retry-scheduler "
                    "breakers list)", run_id, sum(paused.values()), ", ".join(sorted(paused)))  # fmt: skip
    return refused, paused


def read_selection(
    spark: SparkSession,
    jdbc: JdbcTarget,
    selection: Selection,
    summary: SelectionSummary,
    partitions: int,
    fetchsize: int,
) -> DataFrame:
    """The selected jobs, read over JDBC in ``partitions`` id ranges, ``fetchsize`` rows per round trip."""
    assert summary.min_id is not None and summary.max_id is not None
    reader = spark.read.format("jdbc").options(**jdbc.options())
    try:
        return (
            reader.option("dbtable", jdbc_table(selection, summary.min_id, summary.max_id))
            .option("partitionColumn", "id")
            .option("lowerBound", str(summary.min_id))
            .option("upperBound", str(summary.max_id + 1))
            .option("numPartitions", str(max(1, min(partitions, summary.count))))
            .option("fetchsize", str(fetchsize))
            .load()
        )
    except Exception as exc:
        if "org.postgresql.Driver" in str(exc) or "No suitable driver" in str(exc):
            raise BulkRetryError(
                "the PostgreSQL JDBC driver is not on Spark's classpath: pass "
                "--jars /usr/share/java/postgresql.jar (Debian libpostgresql-jdbc-java) or "
                "--conf spark.jars.packages=org.postgresql:postgresql:42.7.4"
            ) from exc
        raise
