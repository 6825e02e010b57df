"""Bulk retry (retry_scheduler.spark.bulk_retry, the job include/spark/bulk_retry.py): selection, record building, and runs on the real
PostgreSQL and the embedded broker.

Tests marked ``spark`` and ``integration`` run the job's ``main()`` in the session's SparkSession.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from pyspark.sql import SparkSession

from bench.jobs import Job, insert_jobs
from retry_scheduler.cli import main as cli
from retry_scheduler.core import protocol
from retry_scheduler.core.config import Settings
from retry_scheduler.core.jobs import (
    HELD_DUE_MS,
    REPLAYED,
    OutgoingRow,
    Status,
    destination_headers,
    encode_headers,
)
from retry_scheduler.db.selection import Selection, SelectionError
from retry_scheduler.db.store import Store
from retry_scheduler.spark import bulk_options, bulk_publish, bulk_retry
from retry_scheduler.spark.connection_file import connection_file
from retry_scheduler.spark.jdbc import JobArgumentError, fetch_rows
from retry_scheduler.spark.selection import OUTGOING_COLUMNS, BulkRetryError, jdbc_table, publishable
from retry_scheduler.spark.submit import bulk_retry_args
from tests.kafkautil import Seen, consume, create_topics

PLUS_TWO = timezone(timedelta(hours=2))
PASSTHROUGH = (
    ("trace", b"\x00\xff\xfebin"),
    ("dup", b"1"),
    ("dup", b"2"),
    ("empty", b""),
    ("null", None),
    ("caf\u00e9", "\u00e9t\u00e9".encode()),
)


def make_job(
    offset: int,
    destination: str,
    *,
    status: Status = Status.DEAD,
    error_class: str | None = "app.TimeoutError",
    partition: int | None = None,
) -> Job:
    now = int(time.time() * 1000)
    return Job(
        source_topic="retry", source_partition=0, source_offset=offset, source_timestamp_ms=1,
        destination=destination, destination_partition=partition,
        key=None if offset % 7 == 0 else f"key-{offset}".encode(),
        value=bytes([offset % 256, 0, 255]) + b"payload",
        headers=PASSTHROUGH, attempt=offset % 4, policy="default", reason="boom", error_class=error_class,
        consumer_group="orders-service", retry_id=f"rid-{offset}", original_topic=destination,
        original_partition=offset % 3, original_offset=1000 + offset, original_timestamp_ms=now - offset,
        due_ms=now - 60_000, status=status, dead_reason="exhausted" if status is Status.DEAD else None,
        dlq_topic="retry.dlq",
    )  # fmt: skip


def expected_headers(job: Job) -> list[tuple[str, bytes | None]]:
    """What the normal publish path sends for this job (a dead one replayed: counted, retry.replays)."""
    row = OutgoingRow(
        id=0, destination=job.destination, destination_partition=job.destination_partition, key=job.key,
        value=job.value, headers=encode_headers(job.headers), attempt=job.attempt, policy=job.policy,
        reason=job.reason, error_class=job.error_class, consumer_group=job.consumer_group,
        retry_id=job.retry_id, original_topic=job.original_topic, original_partition=job.original_partition,
        original_offset=job.original_offset, original_timestamp_ms=job.original_timestamp_ms,
        dead_reason=job.dead_reason, dlq_topic=job.dlq_topic,
        chain_state=REPLAYED if job.status is Status.DEAD else None,
    )  # fmt: skip
    return destination_headers(row)


def run(database_url: str, bootstrap: str, *args: str, allowlist: str | None = None) -> dict[str, Any]:
    """The job as spark-submit runs it: its connections in a private file, never on the command line.

    The settings are the environment's (the tests' destination rules), as for a user's command.
    """
    settings = Settings.from_env().with_overrides(
        database_url=database_url, kafka={"bootstrap.servers": bootstrap}
    )
    if allowlist is not None:
        settings = settings.with_overrides(destination_allowlist=allowlist)
    with connection_file(settings) as path:
        return bulk_retry.main(["--connection-file", str(path), "--partitions", "4", *args])


def rows(database_url: str) -> dict[str, tuple[Any, ...]]:
    """retry_id -> (status, published_at, lease_until, updated_at)."""
    with psycopg.connect(database_url) as conn:
        found = conn.execute(
            "SELECT retry_id, status::text, published_at, lease_until, updated_at FROM retry_jobs_all"
        ).fetchall()
    return {r[0]: tuple(r[1:]) for r in found}


def published_ids(database_url: str) -> set[str]:
    return {rid for rid, r in rows(database_url).items() if r[0] == "published"}


def assert_published_like_the_publish_loop(seen: Sequence[Seen], jobs: dict[str, Job]) -> None:
    for record in seen:
        job = jobs[record.header(protocol.ID) or ""]
        assert record.key == job.key
        assert record.value == job.value
        assert record.headers == expected_headers(job)
        # the same, spelled out: pass-through headers byte for byte, attempt raised, id kept
        assert record.headers[: len(PASSTHROUGH)] == list(PASSTHROUGH)
        assert record.header(protocol.ATTEMPT) == str(job.attempt + 1)
        assert record.header(protocol.ID) == job.retry_id
        assert record.header(protocol.REPLAYS) == ("1" if job.status is Status.DEAD else None)
        if job.destination_partition is not None:
            assert record.partition == job.destination_partition


# --- pure parts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("glob", "like"),
    [
        ("app.TimeoutError", "app.TimeoutError"),
        ("*Timeout*", "%Timeout%"),
        ("db.Dead_lock*", "db.Dead!_lock%"),
        ("100%*", "100!%%"),
        ("wow!*", "wow!!%"),
    ],
)
def test_error_class_glob_becomes_an_escaped_like_pattern(glob: str, like: str) -> None:
    assert bulk_retry.like_pattern(glob) == like


def test_jdbc_query_inlines_only_validated_literals() -> None:
    selection = Selection(
        status=Status.DEAD,
        destination="orders.v2",
        error_class="it's\\_*",
        since=datetime(2026, 1, 31, 14, 0, tzinfo=PLUS_TWO),
        until=datetime(2026, 2, 1, tzinfo=UTC),
    )
    table = jdbc_table(selection, 10, 99)
    assert table.startswith("(SELECT id, destination, destination_partition, msg_key AS key")
    # since and until: when the dead jobs went dead (as for every dead-letter operation)
    assert table.endswith(
        "WHERE status = 'dead' AND destination = E'orders.v2'"
        " AND error_class LIKE E'it''s\\\\!_%' ESCAPE '!'"
        " AND dead_at >= '2026-01-31T12:00:00+00:00'::timestamptz"
        " AND dead_at < '2026-02-01T00:00:00+00:00'::timestamptz"
        " AND destination IS NOT NULL AND dead_reason <> 'parked' AND id >= 10 AND id <= 99) AS bulk_retry_selection"
    )
    pending = replace(selection, status=Status.PENDING)  # pending jobs: when their retry was stored
    assert "created_at >= '2026-01-31T12:00:00+00:00'::timestamptz" in jdbc_table(pending, 10, 99)


def test_pending_selection_skips_jobs_leased_by_the_publish_loop() -> None:
    fragments = publishable(Selection(status=Status.PENDING))
    assert "(lease_until IS NULL OR lease_until < now())" in fragments
    assert "held_by IS NULL" in fragments  # a held job waits for its chain
    # dead jobs: a parked one (replayed that often, dead again) only when asked for, by reason or id
    assert publishable(Selection()) == ("destination IS NOT NULL", "dead_reason <> 'parked'")
    assert (
        publishable(Selection(dead_reason="parked"))
        == publishable(Selection(ids=(1,)))
        == ("destination IS NOT NULL",)
    )


@pytest.mark.spark
@pytest.mark.integration
def test_a_pending_bulk_retry_leaves_held_jobs_to_their_chain(
    spark: SparkSession, database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    # Ordered mode: a held job goes out only after the records before it; a bulk retry must not
    # publish it now. A dead one (its place in the chain lost) is replayed like any other.
    orders = f"{topic_prefix}.orders"
    create_topics(bootstrap_servers, [orders])
    free = make_job(1, orders, status=Status.PENDING)
    held = replace(make_job(2, orders, status=Status.PENDING), held_by="rid-1", due_ms=HELD_DUE_MS)
    dead_held = replace(make_job(3, orders), held_by="rid-1")
    with Store(database_url) as store:
        insert_jobs(store, [free, held, dead_held])
    assert run(database_url, bootstrap_servers, "--status", "pending")["published"] == 1
    assert run(database_url, bootstrap_servers)["published"] == 1
    assert published_ids(database_url) == {"rid-1", "rid-3"}
    [replayed] = [
        r for r in consume(bootstrap_servers, [orders], expected=2) if r.header(protocol.ID) == "rid-3"
    ]
    assert replayed.header(protocol.HOLD) == "rid-1"  # as the publish loop sends a held job


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--destination", "orders'; DROP TABLE retry_jobs; --"], "is not a valid topic name"),
        (["--destination", "x" * 250], "is not a valid topic name"),
        (["--error-class", "bad\nclass"], "printable"),
        (["--since", "yesterday"], "is neither an ISO-8601 time"),
        (["--since", "2026-02-01T00:00:00Z", "--until", "2026-01-01T00:00:00Z"], "must be before until"),
        (["--status", "pending", "--dead-reason", "exhausted"], "a dead reason selects dead jobs"),
        (["--run-id", "a b"], "--run-id"),
    ],
)
def test_invalid_filters_are_refused_before_anything_runs(args: list[str], message: str) -> None:
    with pytest.raises(BulkRetryError, match=re.escape(message)):
        bulk_retry.parse_args(["--bootstrap-servers", "b:9092", *args])


def test_mark_batch_must_be_a_positive_count(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        bulk_retry.parse_args(["--bootstrap-servers", "b", "--mark-batch", "0"])
    assert exit_.value.code == 2
    assert "--mark-batch must be between 1 and 1000000" in capsys.readouterr().err
    opts = bulk_retry.parse_args(["--bootstrap-servers", "b"])
    assert opts.mark_batch == 10_000


def test_status_must_be_dead_or_pending() -> None:
    with pytest.raises(SystemExit):
        bulk_retry.parse_args(["--bootstrap-servers", "b", "--status", "published"])
    with pytest.raises(SelectionError, match="status 'published' must be dead or pending"):
        Selection(status=Status.PUBLISHED)
    # a status given as text is the member (the rules that compare it with Status hold)
    assert Selection(status="pending").status is Status.PENDING  # type: ignore[arg-type]
    with pytest.raises(SelectionError, match="a dead reason selects dead jobs"):
        Selection(status="pending", dead_reason="fatal")  # type: ignore[arg-type]


def test_timestamps_without_zone_are_utc() -> None:
    opts = bulk_retry.parse_args(["--bootstrap-servers", "b", "--since", "2026-01-31T12:00:00"])
    assert opts.selection.since == datetime(2026, 1, 31, 12, tzinfo=UTC)
    assert opts.selection.status is Status.DEAD  # the default
    assert (opts.partitions, opts.fetchsize, opts.dry_run) == (8, None, False)


@pytest.mark.parametrize(
    ("url", "jdbc", "props"),
    [
        (
            "postgresql://postgres@127.0.0.1:5432/retry_scheduler",
            "jdbc:postgresql://127.0.0.1:5432/retry_scheduler",
            {"user": "postgres"},
        ),
        (
            "postgres://us%40er:p%3Aw@db.example:6432/my%20db?sslmode=require&application_name=bulk",
            "jdbc:postgresql://db.example:6432/my%20db",
            {"user": "us@er", "password": "p:w", "sslmode": "require", "ApplicationName": "bulk"},
        ),
        ("postgresql://app@[::1]/jobs", "jdbc:postgresql://[::1]:5432/jobs", {"user": "app"}),
        (  # a primary and its replica: pgjdbc connects to the one that takes writes, as libpq
            "postgresql://svc:pw@pg-a:5432,pg-b,[::1]:5433/retry?target_session_attrs=read-write",
            "jdbc:postgresql://pg-a:5432,pg-b:5432,[::1]:5433/retry",
            {"user": "svc", "password": "pw", "targetServerType": "primary"},
        ),
    ],
)
def test_libpq_url_becomes_a_jdbc_url_and_properties(url: str, jdbc: str, props: dict[str, str]) -> None:
    target = bulk_retry.jdbc_target(url)
    # every target asks pgjdbc for binary rows (bytea as bytes, not hex text)
    assert (target.url, target.properties) == (
        jdbc,
        {**props, "prepareThreshold": "-1", "options": "-c statement_timeout=300000"},
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://h/db", "postgresql://"),
        ("postgresql:///db?host=/var/run/postgresql", "no JDBC equivalent"),
        ("postgresql:///db", "Unix socket"),
        ("postgresql://svc@pg-a:5432,:5433/db", "Unix socket"),
        ("postgresql://svc@pg-a:5432,pg-b:54x/db", "invalid port"),
    ],
)
def test_urls_jdbc_cannot_use_are_refused(url: str, message: str) -> None:
    with pytest.raises(JobArgumentError, match=re.escape(message)):
        bulk_retry.jdbc_target(url)


@pytest.mark.parametrize(
    ("largest", "rows"),
    [(None, 10_000), (0, 10_000), (6_000, 10_000), (1024 * 1024, 63), (900_000, 74), (10**12, 1)],
)
def test_jdbc_fetches_hold_at_most_64_mib(largest: int | None, rows: int) -> None:
    assert fetch_rows(largest) == rows
    if 1 < rows < 10_000:  # as many rows as fit 64 MiB, counting 512 bytes for the other columns
        assert rows * (512 + (largest or 0)) <= 64 * 2**20 < (rows + 1) * (512 + (largest or 0))


def test_producer_is_idempotent_whatever_the_extra_settings() -> None:
    conf = bulk_options.producer_settings(
        "b:9092", {"acks": "1", "enable.idempotence": False, "linger.ms": 5}
    )
    assert conf["enable.idempotence"] is True
    assert conf["acks"] == "all"
    assert conf["bootstrap.servers"] == "b:9092"
    assert conf["linger.ms"] == 5


def as_row(job_id: int, job: Job) -> dict[str, Any]:
    """A job as a row of the selection: the columns of OUTGOING_COLUMNS, named like OutgoingRow's fields."""
    return {
        "id": job_id, "destination": job.destination, "destination_partition": job.destination_partition,
        "key": job.key, "value": job.value, "headers": encode_headers(job.headers), "attempt": job.attempt,
        "policy": job.policy, "reason": job.reason, "error_class": job.error_class,
        "consumer_group": job.consumer_group, "retry_id": job.retry_id, "original_topic": job.original_topic,
        "original_partition": job.original_partition, "original_offset": job.original_offset,
        "original_timestamp_ms": job.original_timestamp_ms, "dead_reason": job.dead_reason,
        "dlq_topic": job.dlq_topic, "held_by": job.held_by,
    }  # fmt: skip


def test_a_row_becomes_the_record_the_publish_loop_would_send() -> None:
    import pyarrow as pa

    job = make_job(8, "orders", partition=2)
    # Columns in another order than OutgoingRow's fields, as a query may return them.
    row = dict(reversed(as_row(42, job).items()))
    [outgoing] = bulk_publish.outgoing_rows(pa.RecordBatch.from_pylist([row]))
    msg = bulk_publish.to_message(outgoing)
    assert (msg.job_id, msg.topic, msg.partition) == (42, "orders", 2)
    assert type(msg.key) is bytes and msg.key == job.key
    assert type(msg.value) is bytes and msg.value == job.value
    assert msg.headers == expected_headers(job)
    assert (protocol.ATTEMPT, b"1") in msg.headers  # attempt 0 + 1


def test_a_dead_head_of_a_chain_goes_back_without_its_chain_but_a_pending_one_keeps_it() -> None:
    """Ordered mode: a dead head's chain went on without it; bulk-retried, it is a new record of its
    key (as `dlq replay` sends it). A pending job keeps its retry.blocks: it is still its chain's head."""
    import dataclasses

    import pyarrow as pa

    dead = make_job(9, "orders")
    dead = dataclasses.replace(dead, headers=[*dead.headers, (protocol.BLOCKS, b"chain-1")])
    pending = dataclasses.replace(dead, status=Status.PENDING, dead_reason=None)
    rows = [as_row(1, dead), as_row(2, pending)]
    sent = [bulk_publish.to_message(o) for o in bulk_publish.outgoing_rows(pa.RecordBatch.from_pylist(rows))]
    assert [[v for k, v in m.headers if k == protocol.BLOCKS] for m in sent] == [[], [b"chain-1"]]


class Tally:
    """Stands in for the Spark accumulator of failed deliveries (the one boundary not run here)."""

    def __init__(self) -> None:
        self.value = 0

    def add(self, n: int) -> None:
        self.value += n


def stored_rows(database_url: str) -> list[dict[str, Any]]:
    """The stored jobs as rows of the selection, read with the bulk retry's own column list."""
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        return conn.execute(f"SELECT {OUTGOING_COLUMNS} FROM retry_jobs_all ORDER BY id").fetchall()


@pytest.mark.integration
def test_arrow_batches_are_produced_and_their_acknowledged_jobs_marked_published(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    import pyarrow as pa

    orders = f"{topic_prefix}.orders"
    create_topics(bootstrap_servers, [orders])
    jobs = [make_job(i, orders, partition=i % 3) for i in range(5)]
    with Store(database_url) as store:
        insert_jobs(store, jobs)
    selected = stored_rows(database_url)
    batches = [pa.RecordBatch.from_pylist(selected[:3]), pa.RecordBatch.from_pylist(selected[3:])]
    failed = Tally()
    out = list(
        bulk_publish.publish_batches(
            iter(batches), database_url=database_url, mark_batch=2,
            producer_conf=bulk_options.producer_settings(bootstrap_servers, {}),
            missing=frozenset(), failed_count=failed, flush_timeout_s=30,
        )
    )  # fmt: skip

    # one row per partition for the driver: how many jobs it marked (in batches of 2, 2 and 1), and
    # the seconds its UPDATEs took
    [[partition]] = [batch.to_pylist() for batch in out]
    assert partition["marked"] == 5
    assert 0 < partition["mark_s"] < 60
    assert failed.value == 0
    after = rows(database_url)
    assert {r[0] for r in after.values()} == {"published"}
    assert all(abs(r[1].timestamp() - time.time()) < 60 for r in after.values())  # published_at: the ack
    seen = consume(bootstrap_servers, [orders], expected=5)
    assert len(seen) == 5
    assert_published_like_the_publish_loop(seen, {j.retry_id: j for j in jobs})


def test_a_paced_partition_produces_each_destination_at_its_share_of_the_rate(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """A partition's share of ``--rate``: 8 jobs of one destination and 4 of another at 4/s each
    reach their topics on a schedule of 4 a second (never a burst), every one published once.

    The pace is read where a destination's consumer reads it, in the records' timestamps (set when
    each was produced): the n-th record of a destination goes no sooner than n quarter-seconds after
    its first. One gap alone may be a little shorter than a quarter of a second when the record
    before it went a little late (the producer's poll returned after its turn: 0.264 s then 0.235 s
    in CI), never the records ahead of their turns. The acknowledgements' times carry the broker's
    round trip, which a loaded machine stretches for one record and not the next (CI: 0.37 s then
    0.13 s), so only their span is checked: the partition does not finish before its pace allows."""
    import pyarrow as pa

    orders, payments = f"{topic_prefix}.orders", f"{topic_prefix}.payments"
    create_topics(bootstrap_servers, [orders, payments])
    jobs = [make_job(i, orders if i < 8 else payments) for i in range(12)]
    with Store(database_url) as store:
        insert_jobs(store, jobs)
    acked: dict[str, list[float]] = {}
    by_id = {r["id"]: r["destination"] for r in stored_rows(database_url)}
    for job_id, at_ms in bulk_publish.publish_partition(
        bulk_publish.outgoing_rows(pa.RecordBatch.from_pylist(stored_rows(database_url))),
        producer_conf=bulk_options.producer_settings(bootstrap_servers, {}),
        missing=frozenset(), failed_count=Tally(), flush_timeout_s=30, rate_per_s=4,
    ):  # fmt: skip
        acked.setdefault(by_id[job_id], []).append(at_ms / 1000)
    assert (len(acked[orders]), len(acked[payments])) == (8, 4)
    seen = consume(bootstrap_servers, [orders, payments], expected=12)
    assert sorted(r.header("retry.id") or "" for r in seen) == sorted(j.retry_id for j in jobs)
    for destination, count in ((orders, 8), (payments, 4)):
        at = sorted(r.timestamp_ms / 1000 for r in seen if r.topic == destination)
        behind_first = [round(t - at[0], 3) for t in at]
        assert len(at) == count, (destination, behind_first)
        # never ahead of its turn (timestamps are whole milliseconds)
        assert all(t >= n * 0.25 - 0.002 for n, t in enumerate(behind_first)), (destination, behind_first)
        acks = sorted(acked[destination])
        assert acks[-1] - acks[0] >= (count - 1) * 0.25 - 0.05, (destination, acks)


def test_a_destinations_rate_limit_paces_it_below_the_runs_pace(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """The run's pace is 4/s; one destination's rate limit (2/s) paces it at 2/s, the other at 4/s."""
    import pyarrow as pa

    orders, payments = f"{topic_prefix}.orders", f"{topic_prefix}.payments"
    create_topics(bootstrap_servers, [orders, payments])
    with Store(database_url) as store:
        insert_jobs(store, [make_job(i, orders if i < 4 else payments) for i in range(8)])
    for _ in bulk_publish.publish_partition(
        bulk_publish.outgoing_rows(pa.RecordBatch.from_pylist(stored_rows(database_url))),
        producer_conf=bulk_options.producer_settings(bootstrap_servers, {}),
        missing=frozenset(), failed_count=Tally(), flush_timeout_s=30, rate_per_s=4, rates={payments: 2},
    ):  # fmt: skip
        pass
    seen = consume(bootstrap_servers, [orders, payments], expected=8)
    for destination, gap in ((orders, 0.25), (payments, 0.5)):
        at = sorted(r.timestamp_ms / 1000 for r in seen if r.topic == destination)
        behind_first = [round(t - at[0], 3) for t in at]
        assert len(at) == 4 and all(t >= n * gap - 0.002 for n, t in enumerate(behind_first)), behind_first
    assert behind_first[-1] < 3 * 0.5 + 1.0  # at its limit, not slower than that by much


def test_the_bulk_retry_reads_the_rate_limits_of_the_deployments_policies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policies = tmp_path / "retry_policies.py"
    policies.write_text(
        "from retry_scheduler.core.policy import Policy\n"
        "POLICIES = [Policy('default', delays=['1s'], max_attempts=2)]\n"
        "ALLOWED_DESTINATIONS = ['orders', 'payments']\n"
        "RATE_LIMITS = {'payments': 25}\n"
    )
    monkeypatch.setenv("RETRY_POLICIES", str(policies))
    monkeypatch.setenv("RETRY_DATABASE_URL", "postgresql://x@127.0.0.1/db")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    opts = bulk_options.parse_args(["--rate", "100"])
    rules = opts.deployment.policies.rules
    assert (opts.rate_per_s, rules("payments").rate_limit, rules("orders").rate_limit) == (100.0, 25.0, None)
    assert opts.deployment.destinations.allows("payments") and not opts.deployment.destinations.allows("x")


def test_the_bulk_retry_takes_a_rate_from_the_form_and_the_command_line() -> None:
    """The form's and the CLI's rate become the job's --rate, which its parser reads back; 0 or empty
    is not paced; a bad rate is refused before anything runs."""
    assert bulk_retry_args({"rate": 250, "dry_run": False})[-2:] == ["--rate", "250"]
    assert "--rate" not in bulk_retry_args({"rate": 0}) and "--rate" not in bulk_retry_args({"rate": None})
    with pytest.raises(JobArgumentError, match="rate 'fast' must be jobs per second"):
        bulk_retry_args({"rate": "fast"})
    env = {"RETRY_DATABASE_URL": "postgresql://x@127.0.0.1/db", "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092"}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        assert bulk_options.parse_args(["--rate", "250"]).rate_per_s == 250.0
        assert bulk_options.parse_args(["--rate", "0"]).rate_per_s is None
        with pytest.raises(BulkRetryError, match="rate '-3' must be"):
            bulk_options.parse_args(["--rate", "-3"])


@pytest.mark.spark
def test_arrow_batches_for_the_workers_are_bounded_in_bytes(spark: SparkSession) -> None:
    session = bulk_retry.spark_session()
    assert session.conf.get("spark.sql.execution.arrow.maxBytesPerBatch") == str(64 * 1024 * 1024)


# --- against PostgreSQL and the broker -----------------------------------------------------------


@pytest.mark.spark
@pytest.mark.integration
def test_dry_run_counts_per_destination_and_changes_nothing(
    database_url: str, bootstrap_servers: str, topic_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    orders, payments = f"{topic_prefix}.orders", f"{topic_prefix}.payments"
    create_topics(bootstrap_servers, [orders, payments])
    with Store(database_url) as store:
        insert_jobs(
            store,
            [make_job(i, orders) for i in range(12)]
            + [make_job(100 + i, payments) for i in range(5)]
            + [make_job(200, orders, status=Status.PENDING)],
        )
    before = rows(database_url)

    result = run(database_url, bootstrap_servers, "--dry-run")

    assert result == {
        "run_id": result["run_id"],
        "selected": 17,
        "published": 0,
        "failed": 0,
        "dry_run": True,
        "fetch_rows": None,  # nothing was read over JDBC
        "marking_s": None,
        "phases_s": {"select": result["phases_s"]["select"]},  # a dry run only counts
        "not_allowed": {},
        "paused_by_breaker": {},
        "rate_per_s": None,  # not paced
        "rate_limited": {},  # no destination with a rate limit
    }
    out = capsys.readouterr().out
    assert re.search(rf"{re.escape(orders)}\s+12\n", out)
    assert re.search(rf"{re.escape(payments)}\s+5\n", out)
    assert rows(database_url) == before
    assert consume(bootstrap_servers, [orders, payments], expected=0, timeout_s=10) == []


@pytest.mark.spark
@pytest.mark.integration
def test_publishes_exactly_the_selection_like_the_publish_loop_and_marks_it(
    spark: SparkSession, database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    orders, payments = f"{topic_prefix}.orders", f"{topic_prefix}.payments"
    create_topics(bootstrap_servers, [orders, payments])
    dead_orders = [make_job(i, orders, partition=2 if i % 5 == 0 else None) for i in range(300)]
    others = [make_job(1000 + i, payments) for i in range(20)] + [
        make_job(2000, orders, status=Status.PENDING)
    ]
    with Store(database_url) as store:
        insert_jobs(store, dead_orders + others)
    before = rows(database_url)

    result = run(database_url, bootstrap_servers, "--destination", orders)

    assert (result["selected"], result["published"], result["failed"]) == (300, 300, 0)
    assert result["marking_s"] > 0
    assert result["fetch_rows"] == 10_000  # small records: the most rows per round trip
    seen = consume(bootstrap_servers, [orders], expected=300)
    assert len(seen) == 300
    jobs = {j.retry_id: j for j in dead_orders}
    assert Counter(r.header(protocol.ID) for r in seen) == Counter(jobs.keys())
    assert_published_like_the_publish_loop(seen, jobs)
    assert consume(bootstrap_servers, [payments], expected=0, timeout_s=10) == []

    after = rows(database_url)
    for rid in jobs:
        status, published_at, lease_until, _ = after[rid]
        assert (status, lease_until) == ("published", None)
        assert published_at is not None
        assert abs(published_at.timestamp() - time.time()) < 120
    for job in others:
        assert after[job.retry_id] == before[job.retry_id]  # untouched


@pytest.mark.spark
@pytest.mark.integration
def test_large_records_are_read_a_few_rows_per_round_trip_and_published_whole(
    spark: SparkSession, database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    orders = f"{topic_prefix}.orders"
    create_topics(bootstrap_servers, [orders])
    big = bytes(range(256)) * 3500  # 896 000 bytes, near the 1 MiB record limit
    jobs = {j.retry_id: j for j in (replace(make_job(i, orders), value=big) for i in range(4))}
    with Store(database_url) as store:
        insert_jobs(store, list(jobs.values()))
    largest = max(len(j.key or b"") + len(big) + len(encode_headers(j.headers) or b"") for j in jobs.values())

    result = run(database_url, bootstrap_servers)

    # 64 MiB per JDBC round trip: 74 rows of this size, not the 10 000 that small rows get.
    assert result["fetch_rows"] == fetch_rows(largest) == 74
    assert (result["selected"], result["published"], result["failed"]) == (4, 4, 0)
    seen = consume(bootstrap_servers, [orders], expected=4)
    assert sorted(r.header(protocol.ID) or "" for r in seen) == sorted(jobs)
    assert_published_like_the_publish_loop(seen, jobs)
    assert published_ids(database_url) == set(jobs)


@pytest.mark.spark
@pytest.mark.integration
def test_missing_destination_topic_counts_failed_and_leaves_jobs_dead(
    spark: SparkSession, database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    gone = f"{topic_prefix}.gone"
    with Store(database_url) as store:
        insert_jobs(store, [make_job(i, gone) for i in range(3)])

    result = run(database_url, bootstrap_servers)

    assert (result["selected"], result["published"], result["failed"]) == (3, 0, 3)
    assert {r[0] for r in rows(database_url).values()} == {"dead"}


def fail_marking_after(database_url: str, rows: int) -> None:
    """Make the database refuse every mark after the first ``rows``, as an outage in mid-run would."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE test_marks")
        conn.execute(
            "CREATE FUNCTION test_fail_mark() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF nextval('test_marks') > {rows} THEN "
            "RAISE EXCEPTION 'simulated outage while marking %', NEW.retry_id; END IF; RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER test_fail_mark BEFORE INSERT ON retry_published_jobs FOR EACH ROW EXECUTE FUNCTION test_fail_mark()"
        )


def mend_marking(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DROP TRIGGER test_fail_mark ON retry_published_jobs; DROP FUNCTION test_fail_mark()")


@pytest.mark.spark
@pytest.mark.integration
def test_a_failed_marking_stops_the_run_and_a_rerun_publishes_only_the_unmarked_jobs(
    spark: SparkSession, database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    orders = f"{topic_prefix}.orders"
    create_topics(bootstrap_servers, [orders])
    dead = {j.retry_id: j for j in (make_job(i, orders) for i in range(50))}
    with Store(database_url) as store:
        insert_jobs(store, list(dead.values()))
    fail_marking_after(database_url, 30)  # three batches of 10 get marked, then the database fails
    one_partition = ("--partitions", "1", "--mark-batch", "10")

    with pytest.raises(Exception, match="marking 10 acknowledged jobs published failed") as failure:
        run(database_url, bootstrap_servers, *one_partition)

    assert "simulated outage while marking rid-" in str(failure.value)
    assert "the next run publishes them again with the same retry.id and retry.attempt" in str(failure.value)
    first = published_ids(database_url)
    # The batches before the failing one were committed; that batch and the rest stay dead.
    assert len(first) == 30
    assert {rows(database_url)[rid][0] for rid in set(dead) - first} == {"dead"}
    mend_marking(database_url)

    result = run(database_url, bootstrap_servers, *one_partition)

    assert (result["selected"], result["published"], result["failed"]) == (20, 20, 0)
    assert published_ids(database_url) == set(dead)
    seen = consume(bootstrap_servers, [orders], expected=50)
    # every copy, duplicates too, carries its job's retry.id and retry.attempt
    assert_published_like_the_publish_loop(seen, dead)
    copies = Counter(r.header(protocol.ID) for r in seen)
    assert set(copies) == set(dead)  # every job reached its destination
    assert all(copies[rid] == 1 for rid in first)  # a marked job is never published again

    # Nothing is left to select: a third run publishes and marks nothing.
    again = run(database_url, bootstrap_servers)
    assert (again["selected"], again["published"]) == (0, 0)


def _glob(pattern: str, text: str | None) -> bool:
    return (
        text is not None
        and re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), text, re.S) is not None
    )


@pytest.mark.spark
@pytest.mark.integration
def test_filters_error_class_time_window_and_limit(
    spark: SparkSession, database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    orders = f"{topic_prefix}.orders"
    create_topics(bootstrap_servers, [orders])
    classes = [
        "net.TimeoutError",
        "net.TimeoutXError",
        "net.Timeout_Error",
        "db.O'Brien%Error",
        "db.Deadlock",
        None,
    ]
    jobs = [make_job(i, orders, error_class=classes[i % len(classes)]) for i in range(36)]
    with Store(database_url) as store:
        insert_jobs(store, jobs)
    now = datetime.now(UTC).replace(microsecond=0)
    # job i went dead i hours ago: since and until select dead jobs by when they went dead
    created = {j.retry_id: now - timedelta(hours=j.source_offset) for j in jobs}
    with psycopg.connect(database_url) as conn:
        for rid, at in created.items():
            conn.execute("UPDATE retry_jobs SET dead_at = %s WHERE retry_id = %s", (at, rid))
        ids = dict(conn.execute("SELECT retry_id, id FROM retry_jobs_all").fetchall())

    def count(*args: str) -> int:
        return int(run(database_url, bootstrap_servers, "--dry-run", *args)["selected"])

    since, until = now - timedelta(hours=20, minutes=30), now - timedelta(hours=4, minutes=30)
    in_window = {j.retry_id for j in jobs if since <= created[j.retry_id] < until}
    for pattern in ["net.Timeout_*", "*Error", "db.O'Brien%*", "*%*", "*", "net.TimeoutError"]:
        expected = sum(_glob(pattern, j.error_class) for j in jobs)
        assert count("--error-class", pattern) == expected, pattern
    assert count("--error-class", "net.Timeout_*") == 6  # "_" is not a wildcard
    assert count("--error-class", "*%*") == 6  # nor is "%"
    assert count("--since", since.isoformat(), "--until", until.isoformat()) == len(in_window) == 16
    berlin = until.astimezone(PLUS_TWO).isoformat()  # another zone, same instant
    assert count("--since", since.strftime("%Y-%m-%dT%H:%M:%SZ"), "--until", berlin) == 16
    assert count("--limit", "7") == 7

    # The same filters through the JDBC query the executors read.
    quoted = run(database_url, bootstrap_servers, "--error-class", "db.O'Brien%*")
    expect_quoted = {j.retry_id for j in jobs if j.error_class == "db.O'Brien%Error"}
    assert (quoted["selected"], quoted["published"]) == (6, 6)
    assert published_ids(database_url) == expect_quoted

    combined = run(
        database_url, bootstrap_servers, "--error-class", "*Error", "--since", since.isoformat(),
        "--until", until.isoformat(), "--limit", "5",
    )  # fmt: skip
    candidates = sorted(
        (j for j in jobs if _glob("*Error", j.error_class) and j.retry_id in in_window
         and j.retry_id not in expect_quoted),
        key=lambda j: ids[j.retry_id],
    )  # fmt: skip
    expect_combined = {j.retry_id for j in candidates[:5]}
    assert len(candidates) > 5
    assert (combined["selected"], combined["published"]) == (5, 5)
    assert published_ids(database_url) == expect_quoted | expect_combined
    seen = consume(bootstrap_servers, [orders], expected=11)
    assert {r.header(protocol.ID) for r in seen} == expect_quoted | expect_combined
    assert len(seen) == 11


def test_both_jobs_on_a_database_never_migrated_say_to_migrate(
    bare_database_url: str, jdbc_jar: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # Through spark-submit, as a user runs them: one line saying what to do, exit 2, no traceback.
    monkeypatch.setenv("RETRY_DATABASE_URL", bare_database_url)
    for command, job in ((["bulk-retry", "--dry-run"], "bulk_retry"), (["compact", "--dry-run"], "compact")):
        assert cli.main(command) == 2, command
        err = capfd.readouterr().err
        assert f"{job}: the database" in err and "run `retry-scheduler db migrate` first" in err, err[-2000:]
        assert "Traceback" not in err, err[-2000:]


@pytest.mark.spark
@pytest.mark.integration
def test_jobs_of_a_destination_no_longer_allowed_are_left_alone(
    spark: SparkSession, database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    orders, legacy = f"{topic_prefix}.orders", f"{topic_prefix}.legacy"
    create_topics(bootstrap_servers, [orders, legacy])
    with Store(database_url) as store:
        insert_jobs(
            store, [make_job(i, orders) for i in range(5)] + [make_job(10 + i, legacy) for i in range(3)]
        )

    # The deployment took the legacy topic off its list after these jobs died.
    only_orders = rf"{re.escape(orders)}"
    dry = run(database_url, bootstrap_servers, "--dry-run", allowlist=only_orders)
    assert (dry["selected"], dry["not_allowed"]) == (5, {legacy: 3})
    result = run(database_url, bootstrap_servers, allowlist=only_orders)

    assert (result["selected"], result["published"], result["failed"]) == (5, 5, 0)
    assert result["not_allowed"] == {legacy: 3}
    assert len(consume(bootstrap_servers, [orders], expected=5)) == 5
    assert consume(bootstrap_servers, [legacy], expected=1, timeout_s=3) == []
    statuses = {rid: r[0] for rid, r in rows(database_url).items()}
    assert {statuses[f"rid-{10 + i}"] for i in range(3)} == {"dead"}
    assert {statuses[f"rid-{i}"] for i in range(5)} == {"published"}


@pytest.mark.spark
@pytest.mark.integration
def test_jobs_of_a_destination_whose_breaker_is_open_are_left_to_the_publish_loop(
    spark: SparkSession, database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    orders, payments = f"{topic_prefix}.orders", f"{topic_prefix}.payments"
    create_topics(bootstrap_servers, [orders, payments])
    with Store(database_url) as store:
        insert_jobs(
            store, [make_job(i, orders) for i in range(4)] + [make_job(10 + i, payments) for i in range(3)]
        )
        store.breakers.set_states([payments], "open", "its consumer fails everything", "test")
    dry = run(database_url, bootstrap_servers, "--dry-run")
    assert (dry["selected"], dry["paused_by_breaker"]) == (4, {payments: 3})
    result = run(database_url, bootstrap_servers)
    assert (result["selected"], result["published"], result["paused_by_breaker"]) == (4, 4, {payments: 3})
    assert consume(bootstrap_servers, [payments], expected=1, timeout_s=3) == []
    statuses = {rid: r[0] for rid, r in rows(database_url).items()}
    assert {statuses[f"rid-{10 + i}"] for i in range(3)} == {"dead"}
    assert audit_rows(database_url)[-1][8] == {"breaker open": 3}


def audit_rows(database_url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT action, dry_run, actor, source, run_id, filter, matched, affected, skipped,"
            " finished_at IS NOT NULL FROM retry_dlq_audit ORDER BY id"
        ).fetchall()


@pytest.mark.spark
@pytest.mark.integration
def test_one_bulk_replay_at_a_time_each_audited(
    spark: SparkSession, database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    orders = f"{topic_prefix}.orders"
    create_topics(bootstrap_servers, [orders])
    with Store(database_url) as store:
        insert_jobs(store, [make_job(i, orders) for i in range(4)])

    with psycopg.connect(database_url, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(7311, hashtext('retry_bulk_replay'))")  # a run in progress
        with pytest.raises(BulkRetryError, match="another bulk replay is in progress"):
            run(database_url, bootstrap_servers, "--destination", orders)
        dry = run(database_url, bootstrap_servers, "--destination", orders, "--dry-run", "--actor", "alice")
    assert {r[0] for r in rows(database_url).values()} == {"dead"}  # the refused run touched nothing

    done = run(database_url, bootstrap_servers, "--destination", orders, "--actor", "bob", "--source", "dag")
    assert done["published"] == 4
    filt = {"status": "dead", "destination": orders}
    assert audit_rows(database_url) == [
        ("bulk_replay", True, "alice", "cli", dry["run_id"], filt, 4, 0, {}, True),
        ("bulk_replay", False, "bob", "dag", done["run_id"], filt, 4, 4, {}, True),
    ]
    # The lock is the run's only: the next run takes it again.
    assert run(database_url, bootstrap_servers, "--destination", orders)["selected"] == 0


# --- connection settings: what the Airflow hook accepts, the Spark jobs accept -------------------------


@pytest.mark.parametrize(
    ("query", "props"),
    [
        ("options=-c%20search_path%3Dretry", {"options": "-c search_path=retry -c statement_timeout=300000"}),
        ("target_session_attrs=read-write", {"targetServerType": "primary"}),
        ("target_session_attrs=prefer-standby", {"targetServerType": "preferSecondary"}),
        ("target_session_attrs=standby", {"targetServerType": "secondary"}),
        ("sslpassword=k%40y", {"sslpassword": "k@y"}),
        ("gssencmode=disable", {"gssEncMode": "disable"}),
        ("keepalives=1", {"tcpKeepAlive": "true"}),
        ("keepalives=0&keepalives_idle=30", {"tcpKeepAlive": "false"}),
        ("keepalives_idle=30&keepalives_interval=5&keepalives_count=3", {"tcpKeepAlive": "true"}),
        ("channel_binding=prefer", {}),
    ],
)
def test_every_libpq_parameter_the_hook_accepts_becomes_its_pgjdbc_property(
    query: str, props: dict[str, str]
) -> None:
    target = bulk_retry.jdbc_target(f"postgresql://svc@db:5432/retry?{query}")
    expected = {"user": "svc", "prepareThreshold": "-1", "options": "-c statement_timeout=300000", **props}
    assert target.properties == expected


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("sslcrl=/etc/crl.pem", "sslcrl='/etc/crl.pem': pgjdbc cannot check a certificate revocation list"),
        ("channel_binding=require", "channel_binding='require': pgjdbc here cannot be made to require"),
        (
            "target_session_attrs=primary-ish",
            "target_session_attrs='primary-ish' must be one of any, read-write",
        ),
        ("hostaddr=10.0.0.1", "hostaddr have no JDBC equivalent"),
    ],
)
def test_what_pgjdbc_cannot_do_is_refused_naming_it(query: str, message: str) -> None:
    with pytest.raises(JobArgumentError, match=re.escape(message)):
        bulk_retry.jdbc_target(f"postgresql://svc@db/retry?{query}")


def test_the_statement_timeout_setting_reaches_the_jdbc_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRY_STATEMENT_TIMEOUT_MS", "1500")
    target = bulk_retry.jdbc_target("postgresql://svc@db/retry?options=-c%20lock_timeout%3D2s")
    assert target.properties["options"] == "-c lock_timeout=2s -c statement_timeout=1500"
    monkeypatch.setenv("RETRY_STATEMENT_TIMEOUT_MS", "0")  # no limit, as for every other connection
    assert (
        bulk_retry.jdbc_target("postgresql://svc@db/retry").properties["options"] == "-c statement_timeout=0"
    )


def test_the_options_keep_secrets_out_of_their_repr(tmp_path: Path) -> None:
    settings = Settings(
        database_url="postgresql://svc:db-secret@db/retry",
        kafka={"bootstrap.servers": "b:9092", "sasl.password": "kafka-secret"},
    )
    with connection_file(settings) as path:
        opts = bulk_retry.parse_args(["--connection-file", str(path)])
    assert opts.database_url.endswith("db-secret@db/retry")  # the job has it...
    text = repr(opts)
    assert "db-secret" not in text and "kafka-secret" not in text  # ...its logs never show it
    assert "b:9092" in text


@pytest.mark.spark
@pytest.mark.integration
def test_a_statement_past_the_limit_is_cut_in_a_spark_jdbc_session(
    spark: SparkSession, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RETRY_STATEMENT_TIMEOUT_MS", "500")
    target = bulk_retry.jdbc_target(database_url)
    read = spark.read.format("jdbc").options(**target.options())
    assert read.option("query", "SELECT pg_sleep(0.05) IS NULL AS ok").load().collect()[0].ok is False
    with pytest.raises(Exception, match="canceling statement due to statement timeout"):
        read.option("query", "SELECT pg_sleep(5) IS NULL AS ok").load().collect()


@pytest.mark.spark
@pytest.mark.integration
def test_a_connection_with_libpq_options_runs_the_bulk_retry(
    spark: SparkSession, database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """Once refused ("no JDBC equivalent"): the README recommends ``options`` on the retry_postgres connection."""
    orders = f"{topic_prefix}.orders"
    create_topics(bootstrap_servers, [orders])
    jobs = [make_job(i, orders) for i in range(5)]
    with Store(database_url) as store:
        insert_jobs(store, jobs)
    url = f"{database_url}?options=-c%20lock_timeout%3D4000&target_session_attrs=read-write&keepalives=1"

    result = run(url, bootstrap_servers)

    assert (result["selected"], result["published"], result["failed"]) == (5, 5, 0)
    assert published_ids(database_url) == {j.retry_id for j in jobs}
