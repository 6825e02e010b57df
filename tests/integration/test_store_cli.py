"""Schema, checked transitions and the status command on the real PostgreSQL."""

from __future__ import annotations

import dataclasses
import json
import os
import time

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from bench.jobs import Job, insert_jobs
from retry_scheduler.cli.main import main
from retry_scheduler.core.jobs import Status
from retry_scheduler.db.connection import StoreError
from retry_scheduler.db.schema import migrate
from retry_scheduler.db.store import Store

pytestmark = pytest.mark.integration


def make_job(
    offset: int, status: Status = Status.PENDING, due_ms: int | None = None, dead: str | None = None
) -> Job:
    now = int(time.time() * 1000)
    return Job(
        source_topic="retry", source_partition=0, source_offset=offset, source_timestamp_ms=1, destination="orders",
        destination_partition=None, key=b"k", value=b"v", headers=(("h", b"1"),), attempt=0,
        policy="default", reason=None, error_class=None, consumer_group=None, retry_id=f"id-{offset}",
        original_topic="orders", original_partition=None, original_offset=None,
        original_timestamp_ms=now, due_ms=due_ms if due_ms is not None else now - 60_000,
        status=status, dead_reason=dead, dlq_topic="retry.dlq",
    )  # fmt: skip


def test_migrate_is_idempotent_and_recorded(database_url: str) -> None:
    assert migrate(database_url) == []  # the template is already migrated
    with psycopg.connect(database_url) as conn:
        versions = conn.execute("SELECT version, name FROM retry_schema_version ORDER BY version").fetchall()
    assert versions == [
        (1, "0001_retry_jobs"),
        (2, "0002_retry_loops"),
        (3, "0003_bulk_and_compaction"),
        (4, "0004_dlq_operations"),
        (5, "0005_throughput"),
        (6, "0006_transition_after"),
        (7, "0007_bulk_marks_in_executors"),
        (8, "0008_bulk_replay_audit"),
        (9, "0009_queue_table_vacuum"),
        (10, "0010_adopted_dead_letters"),
        (11, "0011_held_jobs"),
        (12, "0012_compaction_days"),
        (13, "0013_loop_claim_floor"),
        (14, "0014_published_jobs"),
        (15, "0015_destination_lanes"),
        (16, "0016_reevaluate_audit"),
        (17, "0017_chain_rules"),
        (18, "0018_chain_heads"),
        (19, "0019_replay_rate"),
        (20, "0020_parked"),
        (21, "0021_watched_replay"),
        (22, "0022_destination_rate_limits"),
        (23, "0023_replay_approval"),
        (24, "0024_destination_breakers"),
        (25, "0025_refused_approval"),
        (26, "0026_lateness"),
        (27, "0027_database_identity"),
    ]
    with psycopg.connect(database_url) as conn:
        [options] = conn.execute(
            "SELECT reloptions FROM pg_class WHERE relname = 'retry_jobs'"
        ).fetchone() or [None]
    assert (
        "autovacuum_vacuum_scale_factor=0.01" in options and "autovacuum_analyze_scale_factor=0.02" in options
    )


def test_migration_0007_marks_what_a_crashed_bulk_retry_had_staged_then_drops_the_staging(
    database_url: str,
) -> None:
    with Store(database_url) as store:
        insert_jobs(
            store, [make_job(1, Status.DEAD, dead="exhausted"), make_job(2, Status.DEAD, dead="fatal")]
        )
    with psycopg.connect(database_url, autocommit=True) as conn:
        # The database as 0006 left it, with the acknowledgements of a bulk retry that crashed before marking.
        conn.execute("DELETE FROM retry_schema_version WHERE version = 7")
        # (0014, applied after 0007, moves published jobs out of retry_jobs: allowed here as before it)
        conn.execute("ALTER TABLE retry_jobs DROP CONSTRAINT retry_jobs_not_published")
        conn.execute("CREATE UNLOGGED TABLE retry_bulk_delivered (run_id text, id bigint, acked_ms bigint)")
        conn.execute(
            "INSERT INTO retry_bulk_delivered SELECT 'crashed', id, 1800000000000 FROM retry_jobs "
            "WHERE source_offset = 1"
        )

    assert migrate(database_url) == ["0007_bulk_marks_in_executors"]

    with psycopg.connect(database_url) as conn:
        jobs = conn.execute(
            "SELECT source_offset, status::text, dead_reason, extract(epoch FROM published_at)"
            " FROM retry_jobs ORDER BY source_offset"
        ).fetchall()
        staging = conn.execute("SELECT to_regclass('retry_bulk_delivered')").fetchone()
    assert jobs == [(1, "published", None, 1_800_000_000), (2, "dead", "fatal", None)]
    assert staging == (None,)


def test_unmigrated_database_says_what_to_run(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DROP TABLE retry_jobs, retry_published_jobs CASCADE; DROP TYPE retry_job_status")
    with pytest.raises(StoreError, match="run `retry-scheduler db migrate`"):
        Store(database_url)


def test_insert_ignores_duplicate_source_offsets(database_url: str) -> None:
    with Store(database_url) as store:
        assert insert_jobs(store, [make_job(1), make_job(2, Status.DEAD, dead="fatal")]) == [None, "fatal"]
        assert insert_jobs(store, [make_job(2, Status.DEAD, dead="fatal"), make_job(3)]) == [None]


def test_a_record_read_again_after_its_job_was_published_is_not_stored_twice(database_url: str) -> None:
    """Published jobs leave retry_jobs (migration 0014): the duplicate check looks where they went."""

    def ingest(*offsets: int) -> list[str | None]:  # as the ingest loop stores a batch
        rows = [make_job(o).copy_row() for o in offsets]
        return store.queue.insert_rows(rows, consumer_group="g", offsets={("retry", 0): max(offsets) + 1})

    with Store(database_url) as store:
        assert ingest(1) == [None]
        with store.conn.transaction():
            [row] = store.queue.claim_due(10)
            assert store.queue.mark_published([(row.id, int(time.time() * 1000))]) == 1
        assert store.queue.ingested_record_timestamp("retry", 0, 1) == make_job(1).source_timestamp_ms
        # Read again from below the offset stored with the rows (Kafka's offsets lost, say): only
        # the new record is stored.
        assert ingest(1, 2) == [None]
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT source_offset, status::text FROM retry_jobs_all ORDER BY 1").fetchall()
        hot = conn.execute("SELECT source_offset FROM retry_jobs").fetchall()
    assert rows == [(1, "published"), (2, "pending")]
    assert hot == [(2,)], "the published job left retry_jobs"


def test_a_recreated_topic_reusing_offsets_is_not_taken_for_duplicates(database_url: str) -> None:
    with Store(database_url) as store:
        assert len(insert_jobs(store, [make_job(1)])) == 1
        reborn = dataclasses.replace(make_job(1), source_timestamp_ms=2)  # same offset, a new record
        assert len(insert_jobs(store, [reborn])) == 1


def test_invalid_status_transitions_fail_loudly(database_url: str) -> None:
    with Store(database_url) as store:
        insert_jobs(store, [make_job(1)])
        with store.conn.transaction():
            [row] = store.queue.claim_due(10)
            store.queue.mark_published([(row.id, int(time.time() * 1000))])
    with (
        psycopg.connect(database_url) as conn,
        pytest.raises(psycopg.errors.CheckViolation, match="retry_published_jobs_published"),
    ):
        conn.execute("UPDATE retry_published_jobs SET status = 'pending'")
    with Store(database_url) as store:
        insert_jobs(store, [make_job(2), make_job(3, Status.DEAD, dead="fatal")])
    # A job is published by moving it (mark_published), never in place.
    with (
        psycopg.connect(database_url) as conn,
        pytest.raises(psycopg.errors.CheckViolation, match="retry_jobs_not_published"),
    ):
        conn.execute("UPDATE retry_jobs SET status = 'published', dead_reason = NULL WHERE source_offset = 2")


def test_claims_skip_future_jobs_and_jobs_another_publisher_holds(database_url: str) -> None:
    future = int(time.time() * 1000) + 3_600_000
    with Store(database_url) as a, Store(database_url) as b:
        insert_jobs(a, [make_job(1), make_job(2, due_ms=future)])
        with a.conn.transaction():
            first = a.queue.claim_due(10)
            assert [r.retry_id for r in first] == ["id-1"]
            with b.conn.transaction():
                assert b.queue.claim_due(10) == []  # locked by a, the other not due
            raise psycopg.Rollback()  # as when a's publisher dies before its mark: the job is free again at once
        with b.conn.transaction():
            assert [r.retry_id for r in b.queue.claim_due(10)] == ["id-1"]


def test_a_claim_reads_the_due_jobs_only_in_due_order_whatever_the_statistics(database_url: str) -> None:
    """The claim walks retry_jobs_due_idx and stops at the first job not yet due: with 5 000 jobs
    pending later it reads 10 index entries, not 5 010, and it does so on a table never analyzed (the
    planner, left alone, then scans every pending job and sorts them). The plan is the one of the
    real ``Store.claim_due`` call, sent back by PostgreSQL's auto_explain as a notice."""
    now = int(time.time() * 1000)
    with Store(database_url) as store:
        insert_jobs(store, [make_job(i, due_ms=now - 60_000 + i) for i in range(10)])
        insert_jobs(store, [make_job(100 + i, due_ms=now + 3_600_000 + i) for i in range(5_000)])
        for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                        "SET auto_explain.log_analyze = on", "SET auto_explain.log_format = json",
                        "SET auto_explain.log_level = notice"):  # fmt: skip
            store.conn.execute(setting)  # type: ignore[arg-type]
        notices: list[str] = []
        store.conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))

        with store.conn.transaction():
            claimed = store.queue.claim_due(2_000)
            raise psycopg.Rollback()
        assert [r.retry_id for r in claimed] == [f"id-{i}" for i in range(10)]  # oldest due first
        store.conn.execute("SELECT current_setting('enable_sort')")  # (the transaction ended: as configured)

    plans = [json.loads(n[n.index("{") :]) for n in notices if "FOR UPDATE SKIP LOCKED" in n]
    assert len(plans) == 1, notices

    def nodes(node: dict) -> list[dict]:
        return [node, *(n for child in node.get("Plans", []) for n in nodes(child))]

    tree = nodes(plans[0]["Plan"])
    scans = [n for n in tree if n["Node Type"].endswith("Scan") and n.get("Relation Name") == "retry_jobs"]
    assert [(n["Node Type"], n.get("Index Name")) for n in scans] == [("Index Scan", "retry_jobs_due_idx")]
    # the held jobs' chain state (ordered mode) is looked up for held jobs only: none here
    others = [n for n in tree if n["Node Type"].endswith("Scan") and n not in scans]
    assert [(n.get("Index Name"), n["Actual Loops"]) for n in others] == [("retry_released_holds_pkey", 0)]
    assert "statement_timestamp()" in scans[0]["Index Cond"]
    assert scans[0]["Actual Rows"] == 10 and scans[0].get("Rows Removed by Filter", 0) == 0
    assert not any(n["Node Type"] == "Sort" for n in tree)
    # inside the publisher's transaction, what follows the claim plans as configured again
    reset = [n for n in notices if "set_config('enable_sort', $3" in n]
    assert reset, notices
    with psycopg.connect(database_url) as conn, conn.transaction():
        from retry_scheduler.db.schema import queries

        conn.execute("SET LOCAL enable_bitmapscan = off")  # as a session or role may set it
        plan = conn.execute(queries()["claim_plan"]).fetchone()
        assert plan is not None and plan[:3] == ("on", "off", "on")
        assert conn.execute("SHOW enable_sort").fetchone() == ("off",)
        conn.execute(
            queries()["claim_plan_reset"], dict(zip(("seqscan", "bitmapscan", "sort"), plan[:3], strict=True))
        )
        assert conn.execute("SHOW enable_sort").fetchone() == ("on",)
        assert conn.execute("SHOW enable_bitmapscan").fetchone() == ("off",)


def test_the_wait_after_a_claim_reads_from_the_claim_on_not_the_published_jobs_before_it(
    database_url: str,
) -> None:
    """After a claim that was not full, the publisher asks when the next job falls due. Jobs published
    since the last VACUUM keep their entries at the head of retry_jobs_due_idx (autovacuum off, as on
    this machine and in CI, or not yet run), and the plain read walks every one of them; the read
    after the claim starts where the claim did. Plans from auto_explain, as the server ran them."""
    now = int(time.time() * 1000)
    # A transaction open meanwhile (a report, a Spark job's JDBC read) keeps the published jobs' old
    # versions visible to it: their index entries cannot be skipped until it ends, however often walked.
    with Store(database_url) as store, psycopg.connect(database_url) as holder:
        insert_jobs(store, [make_job(i, due_ms=now - 60_000 + i) for i in range(3_000)])
        holder.execute("SELECT txid_current()")
        with store.conn.transaction():
            claimed = store.queue.claim_due(5_000)
            store.queue.mark_published([(r.id, now) for r in claimed])
        assert len(claimed) == 3_000
        insert_jobs(store, [make_job(10_000, due_ms=now + 3_600_000)])  # due in an hour
        with store.conn.transaction():
            assert store.queue.claim_due(5_000) == []
        after = store.queue.claimed_up_to
        assert after is not None

        for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                        "SET auto_explain.log_analyze = on", "SET auto_explain.log_buffers = on",
                        "SET auto_explain.log_format = json",
                        "SET auto_explain.log_level = notice"):  # fmt: skip
            store.conn.execute(setting)  # type: ignore[arg-type]
        notices: list[str] = []
        store.conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        plain = store.queue.seconds_until_next_due()
        bounded = store.queue.seconds_until_next_due(after=after)
        assert plain is not None and bounded is not None and 3_500 < bounded <= plain + 1 < 3_602

        # A job falling due between the claim and the read is found: the publisher goes round at once.
        insert_jobs(store, [make_job(10_001, due_ms=int(after.timestamp() * 1000) + 1)])
        late = store.queue.seconds_until_next_due(after=after)
        assert late is not None and late < 0

    plans = [json.loads(n[n.index("{") :]) for n in notices if "clock_timestamp()" in n]

    def scan(bounded: bool) -> dict:
        [plan] = [p for p in plans if ("due_at >" in p["Query Text"]) == bounded][:1]
        node = plan["Plan"]
        while "Index Name" not in node:
            node = node["Plans"][0]
        assert node["Index Name"] == "retry_jobs_due_idx", node
        return dict(node)

    # every published job's entry, each a visit to the table, then the pending one
    assert scan(bounded=False)["Heap Fetches"] >= 3_000
    # from the claim on: the pending one (an index scan, which also marks dead entries it meets)
    bounded_scan = scan(bounded=True)
    assert bounded_scan["Node Type"] == "Index Scan" and bounded_scan["Shared Hit Blocks"] <= 5, bounded_scan


HEAP_XMAX_IS_MULTI = 0x1000


def multixact_deleters(conn: psycopg.Connection) -> int:
    """Row versions of retry_jobs, dead ones included, whose deleter is a MultiXact (pageinspect)."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
    pages = conn.execute(
        "SELECT pg_relation_size('retry_jobs') / current_setting('block_size')::int"
    ).fetchone()
    assert pages is not None
    found = conn.execute(
        "SELECT count(*) FROM generate_series(0, %s - 1) AS p,"
        " heap_page_items(get_raw_page('retry_jobs', p::int)) AS i WHERE i.t_infomask & %s <> 0",
        (pages[0], HEAP_XMAX_IS_MULTI),
    ).fetchone()
    assert found is not None
    return int(found[0])


def test_jobs_claimed_and_marked_in_one_transaction_are_not_left_with_multixact_deleters(
    database_url: str,
) -> None:
    """The publisher's claim and marks join its transaction (no savepoint each): a row locked in one
    subtransaction and updated in another gets a MultiXact as its old version's deleter, which no
    index scan can judge dead, so every later claim walked that job's entry in the due index."""
    with Store(database_url) as store, psycopg.connect(database_url, autocommit=True) as admin:
        insert_jobs(store, [make_job(i) for i in range(50)])
        with store.conn.transaction():  # as Publisher.publish_once does
            claimed = store.queue.claim_due(1_000)
            assert store.queue.mark_published([(r.id, int(time.time() * 1000)) for r in claimed]) == 50
        assert multixact_deleters(admin) == 0

        # The check sees them where they are: the same two steps, each in a savepoint of its own.
        insert_jobs(store, [make_job(100 + i) for i in range(50)])
        with store.conn.transaction():
            with store.conn.transaction():
                ids = [r[0] for r in store.conn.execute(
                    "SELECT id FROM retry_jobs WHERE status = 'pending' FOR UPDATE"
                )]  # fmt: skip
            with store.conn.transaction():
                store.conn.execute(
                    "DELETE FROM retry_jobs WHERE id = ANY(%s)", (ids,)
                )  # as the mark moves them
        assert multixact_deleters(admin) == 50


def test_a_publisher_stuck_in_its_transaction_lets_its_jobs_go_after_the_lease(database_url: str) -> None:
    with Store(database_url) as stuck, Store(database_url) as other:
        insert_jobs(stuck, [make_job(1)])
        stuck.queue.limit_idle_transactions(300)
        stuck.conn.execute("SELECT 'a transaction begins'")
        assert len(stuck.queue.claim_due(10)) == 1
        with other.conn.transaction():
            assert other.queue.claim_due(10) == []
        time.sleep(1.0)  # the stuck session is ended by the server
        with other.conn.transaction():
            assert [r.retry_id for r in other.queue.claim_due(10)] == ["id-1"]
        with pytest.raises(psycopg.Error, match="idle-in-transaction timeout"):
            stuck.conn.execute("SELECT 1")


def test_claim_due_refuses_to_run_outside_a_transaction(database_url: str) -> None:
    with Store(database_url) as store, pytest.raises(StoreError, match="inside a transaction"):
        store.queue.claim_due(10)


def test_status_json_counts_by_status(
    database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with Store(database_url) as store:
        insert_jobs(
            store,
            [
                make_job(1),
                make_job(2),
                make_job(3, Status.DEAD, dead="exhausted"),
                make_job(4, Status.DEAD, dead="invalid"),
            ],
        )
    monkeypatch.setenv("RETRY_DATABASE_URL", database_url)
    assert main(["status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["pending"], report["published"], report["dead"]) == (2, 0, 2)
    assert report["dead_by_reason"] == {"exhausted": 1, "invalid": 1}
    assert report["oldest_overdue"]["overdue_s"] >= 59
    assert main(["status"]) == 0
    text = capsys.readouterr().out
    assert "dead                2  (exhausted 1, invalid 1)" in text
    assert "oldest overdue: job" in text
    # The server's autovacuum, which the queue table needs (this machine's test server runs without)
    with psycopg.connect(database_url) as conn:
        autovacuum = conn.execute("SHOW autovacuum").fetchone() == ("on",)
    assert report["vacuum"]["autovacuum"] is autovacuum and report["vacuum"]["dead_rows"] >= 0
    assert ("warning: autovacuum is off on this PostgreSQL server" in text) is (not autovacuum)
    assert ("the publish loop vacuums it itself (RETRY_SELF_VACUUM" in text) is (not autovacuum)


def test_cli_reports_an_unreachable_database(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RETRY_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/nope")
    assert main(["status"]) == 2
    assert "cannot connect to PostgreSQL" in capsys.readouterr().err


def test_the_loops_and_bulk_retry_with_kafka_unreachable_say_so_in_one_line(
    database_url: str, bare_database_url: str
) -> None:
    """``run`` with nothing listening at the bootstrap address: one line naming the address and the
    setting, exit 2, before any loop starts (it was hundreds of librdkafka lines and, for the ingest,
    a traceback; for the publish loop, exit 0 after publishing nothing). A database never migrated
    is said the same way, before Kafka is tried."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    cli = str(Path(sys.executable).parent / "retry-scheduler")

    def run(url: str, only: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "RETRY_DATABASE_URL": url, "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"}
        return subprocess.run(
            [cli, "run", "--seconds", "5", "--only", only],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    for only in ("ingest", "publish"):
        done = run(database_url, only)
        assert done.returncode == 2, (only, done.returncode, done.stderr[-3000:])
        assert done.stderr.strip().splitlines() == [
            f"retry-scheduler: cannot reach Kafka at 127.0.0.1:{port} within 10 s (Failed to get metadata: "
            "Local: Broker transport failure): set KAFKA_BOOTSTRAP_SERVERS (or the retry_kafka connection) to "
            "brokers this machine can reach, and check that they run and advertise addresses their clients can use"
        ], done.stderr[-3000:]
    # bulk-retry too, before any Spark job starts (a dry run publishes nothing: it needs no Kafka)
    env = {**os.environ, "RETRY_DATABASE_URL": database_url, "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"}
    bulk = subprocess.run([cli, "bulk-retry"], env=env, capture_output=True, text=True, timeout=120)
    assert bulk.returncode == 2, bulk.stderr[-3000:]
    assert bulk.stderr.strip().splitlines() == [
        f"retry-scheduler: cannot reach Kafka at 127.0.0.1:{port} within 10 s (Failed to get metadata: "
        "Local: Broker transport failure): set KAFKA_BOOTSTRAP_SERVERS (or the retry_kafka connection) to "
        "brokers this machine can reach, and check that they run and advertise addresses their clients can use"
    ], bulk.stderr[-3000:]
    unmigrated = run(bare_database_url, "publish")
    assert unmigrated.returncode == 2 and len(unmigrated.stderr.strip().splitlines()) == 1, unmigrated.stderr
    assert "run `retry-scheduler db migrate` first" in unmigrated.stderr


def test_cli_says_how_to_create_a_missing_database(
    database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The server answers, but the database in the URL was never created: the usual first-run mistake.
    missing = database_url.rsplit("/", 1)[0] + "/retry_never_created"
    monkeypatch.setenv("RETRY_DATABASE_URL", missing)
    assert main(["db", "migrate"]) == 2
    err = capsys.readouterr().err
    server = conninfo_to_dict(missing)
    host, port, user = server["host"], server.get("port", "5432"), server["user"]
    assert f'PostgreSQL answers at {host}:{port} but has no database "retry_never_created"' in err
    assert f"createdb -h {host} -p {port} -U {user} retry_never_created" in err
    assert "retry-scheduler dev postgres" in err
    assert "Is it running?" not in err  # it is: that advice would send the user the wrong way


def test_commands_on_a_database_never_migrated_say_to_migrate(
    bare_database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RETRY_DATABASE_URL", bare_database_url)
    for command in (
        ["status"], ["dlq", "list"], ["dlq", "show", "1"], ["dlq", "purge", "--dry-run"], ["dlq", "replay", "--dry-run"]
    ):  # fmt: skip
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert "has no retry_jobs table: run `retry-scheduler db migrate` first" in err, (command, err)
        assert "Traceback" not in err


def test_the_demo_counts_its_own_runs_jobs_with_the_status_figures_whatever_keys_others_stored(
    database_url: str,
) -> None:
    """The demo reads jobs by status and dead jobs by reason where ``status`` does, over its run's
    keys only (repeated demos share the database); a key that is not UTF-8, stored by anyone, is no
    reason for it to fail."""
    from retry_scheduler.core.config import Settings
    from retry_scheduler.dev.demo import _outcome

    tag = f"t{time.time_ns()}"
    mine = [
        dataclasses.replace(make_job(1), key=f"order-1-{tag}".encode()),
        dataclasses.replace(make_job(2, Status.DEAD, dead="exhausted"), key=f"order-2-{tag}".encode()),
        dataclasses.replace(make_job(3, Status.DEAD, dead="invalid"), key=f"bad-3-{tag}".encode()),
    ]
    others = [
        dataclasses.replace(make_job(4, Status.DEAD, dead="exhausted"), key=b"\xff\xfe not utf-8"),
        dataclasses.replace(make_job(5), key=None),
        dataclasses.replace(make_job(6, Status.DEAD, dead="fatal"), key=b"order-6-another-run"),
    ]
    with Store(database_url) as store:
        insert_jobs(store, mine + others)
    outcome = _outcome(Settings(database_url=database_url), tag)
    assert (outcome["ingested"], outcome["pending"], outcome["published"]) == (3, 1, 0)
    assert outcome["dead"] == {"exhausted": 1, "invalid": 1}
    assert (outcome["dead_on_dlq"], outcome["lateness"]) == (0, [])
