"""Dead-letter operations on the real PostgreSQL (and the embedded broker for the replay round trip)."""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from bench.jobs import Job, insert_jobs
from retry_scheduler.cli.main import main
from retry_scheduler.core import protocol as p
from retry_scheduler.core.config import Settings
from retry_scheduler.core.declarations import Destination
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.jobs import Status
from retry_scheduler.core.policy import PolicyRegistry
from retry_scheduler.db.selection import MAX_IDS, Selection, SelectionError
from retry_scheduler.db.store import Store
from retry_scheduler.loops.publish import Publisher
from retry_scheduler.ops import browse
from retry_scheduler.ops.dlq import DlqError, Operation, run_action
from tests.conftest import TEST_DESTINATIONS
from tests.kafkautil import consume, create_topics

pytestmark = pytest.mark.integration


def deployment() -> Deployment:
    """The tests' deployment (their environment), read as a front door does."""
    return Deployment.load(Settings.from_env())


def dead_job(
    offset: int,
    *,
    destination: str | None = "orders",
    reason: str = "exhausted",
    error_class: str | None = "app.TimeoutError",
    text: str | None = None,
    attempt: int = 3,
    value: bytes = b'{"order": 1}',
) -> Job:
    now = int(time.time() * 1000)
    return Job(
        source_topic="retry", source_partition=0, source_offset=offset, source_timestamp_ms=1,
        destination=destination, destination_partition=None, key=f"key-{offset}".encode(), value=value,
        headers=(("trace", b"\x00\x01"),), attempt=attempt, policy="default",
        reason=text or f"call {offset} timed out", error_class=error_class, consumer_group="orders-svc",
        retry_id=f"rid-{offset}", original_topic=destination, original_partition=None, original_offset=None,
        original_timestamp_ms=now, due_ms=now, status=Status.DEAD, dead_reason=reason, dlq_topic="retry.dlq",
    )  # fmt: skip


def insert(database_url: str, jobs: list[Job]) -> None:
    with Store(database_url) as store:
        insert_jobs(store, jobs)


def sql(database_url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = conn.execute(query, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def set_dead_at(database_url: str, ids_to_times: dict[int, datetime]) -> None:
    for job_id, at in ids_to_times.items():
        sql(database_url, "UPDATE retry_jobs SET dead_at = %s WHERE id = %s", at, job_id)


def mark_on_dlq(database_url: str, *ids: int) -> None:
    sql(database_url, "UPDATE retry_jobs SET dlq_published_at = now() WHERE id = ANY(%s)", list(ids))


def ids(page: browse.Page) -> list[int]:
    return [j.id for j in page.jobs]


# --- browsing -----------------------------------------------------------------------------------


def test_list_is_newest_first_and_pages_cover_every_job_once(database_url: str) -> None:
    insert(database_url, [dead_job(i) for i in range(1, 13)])
    base = datetime(2026, 11, 20, tzinfo=UTC)
    # ids 1..12 died an hour apart, except 5 and 6 which died at the same instant (tie broken by id)
    times = {i: base + timedelta(hours=i) for i in range(1, 13)}
    times[6] = times[5]
    set_dead_at(database_url, times)

    seen: list[int] = []
    cursor = None
    pages = 0
    while True:
        page = browse.list_dead(database_url, Selection(), page_size=5, cursor=cursor)
        seen += ids(page)
        pages += 1
        assert page.total == 12 and not page.total_capped
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert pages == 3
    assert seen == [12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1]


def test_filters_select_what_their_names_say(database_url: str) -> None:
    insert(
        database_url,
        [
            dead_job(1, destination="orders", error_class="app.TimeoutError", text="upstream timed out"),
            dead_job(2, destination="payments", error_class="app.TimeoutError", text="gateway timeout"),
            dead_job(3, destination="payments", error_class="app.KeyError", text="missing field 'sku'"),
            dead_job(4, destination="payments", reason="fatal", error_class="SchemaError", text="bad schema"),
            dead_job(5, destination=None, reason="invalid", error_class=None, text="no destination header"),
        ],
    )
    old = datetime(2026, 1, 1, tzinfo=UTC)
    set_dead_at(database_url, {1: old})

    def listed(**params: Any) -> list[int]:
        return sorted(ids(browse.list_dead(database_url, Selection.from_params(params))))

    assert listed(destination="payments") == [2, 3, 4]
    assert listed(dead_reason="fatal") == [4]
    assert listed(dead_reason="invalid") == [5]
    assert listed(error_class="*Timeout*") == [1, 2]
    assert listed(error_class="app.KeyError") == [3]
    assert listed(search="TIMEOUT") == [1, 2]  # any case, reason or error class
    assert listed(search="sku") == [3]
    assert listed(search="100%") == []  # % is text, not a wildcard
    assert listed(until="2026-06-01T00:00:00Z") == [1]
    assert listed(since="2026-06-01T00:00:00Z") == [2, 3, 4, 5]
    assert listed(since="1h") == [2, 3, 4, 5]  # a duration means that long ago
    assert listed(ids="3, 5") == [3, 5]
    assert listed(destination="payments", search="timeout") == [2]
    # published and pending jobs are never dead letters
    sql(database_url, "UPDATE retry_jobs SET status = 'pending', dead_reason = NULL WHERE id = 2")
    assert listed(destination="payments") == [3, 4]


def test_the_count_is_capped_so_a_page_never_counts_a_million_rows(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    insert(database_url, [dead_job(i) for i in range(1, 9)])
    monkeypatch.setattr(browse, "COUNT_CAP", 5)
    page = browse.list_dead(database_url, Selection(), page_size=3)
    assert (page.total, page.total_capped, len(page.jobs)) == (5, True, 3)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"dead_reason": "tired"}, "dead reason 'tired' is not one of"),
        ({"destination": "bad topic"}, "not a valid topic name"),
        ({"since": "yesterday"}, "neither an ISO-8601 time"),
        ({"since": "2026-11-21T10:00:00"}, "needs a time zone"),
        ({"since": "2026-11-21T10:00:00Z", "until": "2026-11-20T10:00:00Z"}, "must be before until"),
        ({"ids": "3,x"}, "ids must be job ids"),
        ({"limit": "-1"}, "limit must be a whole number from 1 to 10,000,000"),
        ({"written_by": "share"}, "written_by needs the deployment's settings"),
    ],
)
def test_bad_filters_say_what_is_wrong(params: dict[str, Any], message: str) -> None:
    with pytest.raises(SelectionError, match=message):
        Selection.from_params(params)


def test_show_renders_text_as_text_binary_as_hex_and_cuts_long_values(database_url: str) -> None:
    job = dataclasses.replace(dead_job(1), key=b"\xff\x00k", value=b"<script>alert(1)</script>" * 400)
    insert(database_url, [job])
    shown = browse.show(database_url, 1)
    assert shown["key"] == {"encoding": "hex", "text": "ff 00 6b", "size": 3, "truncated": False}
    assert shown["value"]["encoding"] == "utf-8"
    assert shown["value"]["text"].startswith("<script>alert(1)</script>")  # data; the page escapes it
    assert (shown["value"]["size"], shown["value"]["truncated"], len(shown["value"]["text"])) == (
        10_000,
        True,
        browse.SHOW_BYTES,
    )
    assert shown["headers"] == [
        {"name": "trace", "value": {"encoding": "hex", "text": "00 01", "size": 2, "truncated": False}}
    ]
    assert (shown["dead_reason"], shown["retry_id"], shown["attempt"]) == ("exhausted", "rid-1", 3)
    with pytest.raises(DlqError, match="there is no job 99"):
        browse.show(database_url, 99)


# --- replay and purge ---------------------------------------------------------------------------


def audit_rows(database_url: str) -> list[tuple[Any, ...]]:
    return sql(
        database_url,
        "SELECT action, dry_run, actor, source, run_id, filter, reset_attempts, matched, affected, skipped,"
        " finished_at IS NOT NULL FROM retry_dlq_audit ORDER BY id",
    )


def test_a_dry_run_changes_nothing_and_is_audited(database_url: str) -> None:
    insert(database_url, [dead_job(1), dead_job(2), dead_job(3, destination=None, reason="invalid")])
    before = sql(database_url, "SELECT * FROM retry_jobs_all ORDER BY id")

    outcome = run_action(
        database_url,
        Operation(
            action="replay",
            selection=Selection(),
            actor="alice",
            source="dag",
            dry_run=True,
            run_id="manual__1",
        ),
        deployment=deployment(),
    )

    assert (outcome.matched, outcome.would_affect, outcome.affected) == (3, 2, 0)
    assert outcome.skipped["invalid, no usable destination"] == 1
    assert "dry run: 2 of 3 selected dead jobs would be replayed" in outcome.summary()
    assert sql(database_url, "SELECT * FROM retry_jobs_all ORDER BY id") == before
    assert audit_rows(database_url) == [
        ("replay", True, "alice", "dag", "manual__1", {}, False, 3, 0,
         {"invalid, no usable destination": 1}, True)
    ]  # fmt: skip


def test_replay_makes_jobs_due_now_keeping_or_resetting_the_attempt(database_url: str) -> None:
    insert(
        database_url,
        [dead_job(1, attempt=3), dead_job(2, attempt=4), dead_job(3, destination=None, reason="invalid")],
    )
    started = sql(database_url, "SELECT now()")[0][0]

    kept = run_action(
        database_url,
        Operation(action="replay", selection=Selection(ids=(1,)), actor="bob", source="cli", dry_run=False),
        deployment=deployment(),
    )
    reset = run_action(
        database_url,
        Operation(
            action="replay",
            selection=Selection(),
            actor="bob",
            source="cli",
            dry_run=False,
            reset_attempts=True,
        ),
        deployment=deployment(),
    )

    assert (kept.affected, reset.affected) == (1, 1)  # job 3 is invalid: left alone
    rows = sql(
        database_url,
        "SELECT id, status::text, attempt, dead_reason, due_at >= %s FROM retry_jobs_all ORDER BY id",
        started,
    )
    assert rows == [(1, "pending", 3, None, True), (2, "pending", 0, None, True), (3, "dead", 3, "invalid", False)]  # fmt: skip
    audit = audit_rows(database_url)
    assert [(a[0], a[1], a[2], a[5], a[6], a[7], a[8]) for a in audit] == [
        ("replay", False, "bob", {"ids": [1]}, False, 1, 1),
        ("replay", False, "bob", {}, True, 2, 1),
    ]


def test_a_limit_takes_the_oldest_jobs_and_batches_add_up(database_url: str) -> None:
    insert(database_url, [dead_job(i) for i in range(1, 11)])
    progress: list[tuple[int, int]] = []

    outcome = run_action(
        database_url,
        Operation(action="replay", selection=Selection(limit=7), actor="carol", source="ui", dry_run=False),
        deployment=deployment(),
        progress=lambda done, total: progress.append((done, total)),
        batch_size=3,
    )

    assert (outcome.matched, outcome.affected) == (7, 7)
    assert progress == [(3, 7), (6, 7), (7, 7)]
    assert sql(database_url, "SELECT id FROM retry_jobs_all WHERE status = 'dead' ORDER BY id") == [
        (8,),
        (9,),
        (10,),
    ]
    assert audit_rows(database_url)[0][7:9] == (7, 7)


def test_a_limit_above_the_typed_ids_bound_selects_that_many(database_url: str) -> None:
    """A limit fixes its jobs by id before acting: more of them than a person may list with ids
    (MAX_IDS) is no error (it was, for any replay or purge limited above 10 000 that matched more)."""
    insert(database_url, [dead_job(i) for i in range(1, MAX_IDS + 6)])
    limited = Operation(
        action="replay", selection=Selection(limit=MAX_IDS + 2), actor="ann", source="cli", dry_run=True
    )
    outcome = run_action(database_url, limited, deployment=deployment())
    assert (outcome.matched, outcome.would_affect) == (MAX_IDS + 2, MAX_IDS + 2)


def test_purge_deletes_only_jobs_already_on_the_dlq_topic(database_url: str) -> None:
    insert(database_url, [dead_job(1), dead_job(2), dead_job(3, destination="payments")])
    mark_on_dlq(database_url, 1, 3)

    dry = run_action(
        database_url,
        Operation(
            action="purge", selection=Selection(destination="orders"), actor="dan", source="cli", dry_run=True
        ),
    )
    assert (dry.matched, dry.would_affect, dry.skipped) == (2, 1, {"not yet on the DLQ topic": 1})
    assert len(sql(database_url, "SELECT id FROM retry_jobs_all")) == 3

    done = run_action(
        database_url,
        Operation(
            action="purge",
            selection=Selection(destination="orders"),
            actor="dan",
            source="cli",
            dry_run=False,
        ),
    )

    assert done.affected == 1
    assert sql(database_url, "SELECT id FROM retry_jobs_all ORDER BY id") == [(2,), (3,)]
    assert [(a[0], a[1], a[8]) for a in audit_rows(database_url)] == [("purge", True, 0), ("purge", False, 1)]


def test_replay_leaves_a_job_alone_while_it_is_being_sent_to_the_dlq(database_url: str) -> None:
    insert(database_url, [dead_job(1), dead_job(2)])
    sql(database_url, "UPDATE retry_jobs SET lease_until = now() + interval '1 minute' WHERE id = 1")

    outcome = run_action(
        database_url,
        Operation(action="replay", selection=Selection(), actor="eve", source="ui", dry_run=False),
        deployment=deployment(),
    )

    assert (outcome.matched, outcome.affected) == (2, 1)
    assert outcome.skipped["being sent to the DLQ topic now"] == 1
    assert sql(database_url, "SELECT id, status::text FROM retry_jobs_all ORDER BY id") == [
        (1, "dead"),
        (2, "pending"),
    ]


# --- the round trip through the broker --------------------------------------------------------------


def publish_for(settings: Settings, seconds: float) -> None:
    with Store(settings.database_url) as store:
        publisher = Publisher(Deployment.load(settings), store)
        try:
            publisher.run(seconds)
        finally:
            publisher.close()


def test_a_replayed_job_is_published_again_and_a_purged_one_is_gone(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    dest, dlq_topic = f"{topic_prefix}.orders", f"{topic_prefix}.dlq"
    create_topics(bootstrap_servers, [dest, dlq_topic])
    settings = Settings(
        database_url=database_url,
        kafka={"bootstrap.servers": bootstrap_servers},
        destination_allowlist=TEST_DESTINATIONS,
        create_topics=True,
        lease_ms=3000,
        delivery_timeout_ms=2000,
        loop_grace_ms=0,
    )
    jobs = [
        dataclasses.replace(dead_job(i, destination=dest, attempt=3), dlq_topic=dlq_topic) for i in (1, 2)
    ]
    insert(database_url, jobs)
    publish_for(settings, 2)  # both dead jobs reach the DLQ topic
    assert len(consume(bootstrap_servers, [dlq_topic], 2)) == 2

    run_action(
        database_url,
        Operation(action="replay", selection=Selection(ids=(1,)), actor="ops", source="cli", dry_run=False),
        deployment=deployment(),
    )
    run_action(
        database_url,
        Operation(action="purge", selection=Selection(ids=(2,)), actor="ops", source="cli", dry_run=False),
    )
    publish_for(settings, 2)

    [seen] = consume(bootstrap_servers, [dest], 1)
    assert (seen.key, seen.value) == (b"key-1", b'{"order": 1}')
    assert (seen.header(p.ID), seen.header(p.ATTEMPT)) == ("rid-1", "4")  # attempt kept, raised by one
    assert seen.header(p.DEAD_REASON) is None
    assert sql(database_url, "SELECT id, status::text FROM retry_jobs_all ORDER BY id") == [(1, "published")]


# --- the command line ---------------------------------------------------------------------------


def test_cli_lists_shows_and_replays_after_a_dry_run(
    database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RETRY_DATABASE_URL", database_url)
    insert(database_url, [dead_job(1), dead_job(2, destination="payments", text="card declined")])

    assert main(["dlq", "list", "--destination", "payments"]) == 0
    out = capsys.readouterr().out
    assert "1 dead job(s) match" in out and "card declined" in out and "call 1" not in out

    assert main(["dlq", "show", "2", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["id"], shown["headers"][0]["value"]["encoding"]) == (2, "hex")

    # not interactive and not confirmed: the dry run is shown, nothing changes
    monkeypatch.setattr("sys.stdin", open("/dev/null"))  # noqa: SIM115
    assert main(["dlq", "replay", "--search", "declined"]) == 2
    captured = capsys.readouterr()
    assert "dry run: 1 of 1 selected dead jobs would be replayed" in captured.out
    assert "add --yes" in captured.err
    assert sql(database_url, "SELECT count(*) FROM retry_jobs_all WHERE status = 'dead'") == [(2,)]

    assert main(["dlq", "replay", "--search", "declined", "--yes"]) == 0
    assert "1 of 1 selected dead jobs replayed" in capsys.readouterr().out
    assert sql(database_url, "SELECT id FROM retry_jobs_all WHERE status = 'pending'") == [(2,)]

    assert main(["dlq", "audit"]) == 0
    audit = capsys.readouterr().out.splitlines()
    assert len(audit) == 3 and "replay 1 done" in audit[0] and "by cli:" in audit[0]

    with pytest.raises(SystemExit) as exited:
        main(["dlq", "list", "--since", "yesterday"])
    assert exited.value.code == 2
    assert "argument --since: 'yesterday' is not a time: write an ISO-8601 time" in capsys.readouterr().err


def test_cli_refuses_to_act_on_every_dead_job_unless_asked_with_all(
    database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--yes`` with no filter acted on every dead job, and ``--limit 0`` meant no limit: both are
    refused, with what to write instead, and nothing is touched; ``--all`` (or a filter) acts."""
    monkeypatch.setenv("RETRY_DATABASE_URL", database_url)
    insert(database_url, [dead_job(i) for i in range(1, 4)])
    mark_on_dlq(database_url, 1, 2, 3)
    for action in ("purge", "replay"):
        assert main(["dlq", action, "--yes"]) == 2
        err = capsys.readouterr().err
        assert f"no filter given: this would {action} every dead job. Add --all" in err, err
    with pytest.raises(SystemExit) as exit_:
        main(["dlq", "purge", "--yes", "--limit", "0"])
    assert exit_.value.code == 2
    assert "must be at least 1, not 0 (for no limit, leave --limit out)" in capsys.readouterr().err
    assert sql(database_url, "SELECT count(*) FROM retry_jobs WHERE status = 'dead'") == [(3,)]
    assert main(["dlq", "purge", "--dry-run"]) == 0  # counting needs no --all
    assert main(["dlq", "purge", "--yes", "--all"]) == 0
    assert "3 of 3 selected dead jobs purged" in capsys.readouterr().out
    assert sql(database_url, "SELECT count(*) FROM retry_jobs_all") == [(0,)]


def test_cli_purges_in_batches_of_the_size_asked(
    database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RETRY_DATABASE_URL", database_url)
    insert(database_url, [dead_job(i) for i in range(1, 6)])
    mark_on_dlq(database_url, 1, 2, 3, 4, 5)

    assert main(["dlq", "purge", "--yes", "--all", "--batch-size", "0"]) == 2
    assert "batch size 0 must be between 1 and 10,000,000" in capsys.readouterr().err
    assert sql(database_url, "SELECT count(*) FROM retry_jobs_all") == [(5,)]

    assert main(["dlq", "purge", "--yes", "--all", "--batch-size", "2"]) == 0
    captured = capsys.readouterr()
    # not a terminal: one plain line per batch on stderr (the bar is for terminals, test_cli.py)
    assert captured.err.splitlines() == ["purge: 2/5 jobs", "purge: 4/5 jobs", "purge: 5/5 jobs"]
    assert "5 of 5 selected dead jobs purged" in captured.out
    assert sql(database_url, "SELECT count(*) FROM retry_jobs_all") == [(0,)]


def test_in_a_terminal_a_replay_shows_a_progress_bar(database_url: str) -> None:
    """stderr a real pseudo-terminal, as in an operator's shell; stdout (the result) a pipe."""
    import os
    import sys
    from pathlib import Path

    from tests.terminal import run_in_terminal

    insert(database_url, [dead_job(i) for i in range(1, 7)])
    command = [
        str(Path(sys.executable).parent / "retry-scheduler"),
        "dlq",
        "replay",
        "--yes",
        "--all",
        "--batch-size",
        "2",
    ]
    code, text, out = run_in_terminal(command, {**os.environ, "RETRY_DATABASE_URL": database_url})
    assert code == 0, text
    assert "replay ━━━━" in text and "6/6 jobs 100%" in text and "elapsed," in text, text
    assert "replay: 2/6 jobs" not in text  # the plain lines are for pipes and logs
    assert "6 of 6 selected dead jobs replayed" in out and "━" not in out
    assert sql(database_url, "SELECT count(*) FROM retry_jobs_all WHERE status = 'pending'") == [(6,)]


def test_replay_leaves_dead_the_jobs_whose_destination_is_no_longer_allowed(database_url: str) -> None:
    insert(
        database_url,
        [dead_job(1), dead_job(2, destination="connect-offsets"), dead_job(3, destination="retry.dlq")],
    )
    # connect-offsets was allowed when these jobs were stored, and taken off the list since.
    allowing = Deployment(Settings(retry_topic="retry"), PolicyRegistry.of([], [Destination("orders")]))

    dry = run_action(
        database_url,
        Operation(action="replay", selection=Selection(), actor="ann", source="cli", dry_run=True),
        deployment=allowing,
    )
    assert (dry.matched, dry.would_affect) == (3, 1)
    assert dry.skipped["destination not allowed"] == 2
    assert "2 destination not allowed" in dry.summary()

    done = run_action(
        database_url,
        Operation(action="replay", selection=Selection(), actor="ann", source="cli", dry_run=False),
        deployment=allowing,
    )
    assert done.affected == 1
    assert sql(database_url, "SELECT id, status::text FROM retry_jobs_all ORDER BY id") == [
        (1, "pending"),
        (2, "dead"),
        (3, "dead"),
    ]
    assert audit_rows(database_url)[-1][9] == {"destination not allowed": 2}


def test_the_cli_replays_by_the_deployment_s_destination_rules(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The checkout's dags/retry_policies.py allows orders, payments and demo.*; nothing declares audit-log.
    insert(database_url, [dead_job(1), dead_job(2, destination="audit-log")])
    assert main(["--database-url", database_url, "dlq", "replay", "--yes", "--all"]) == 0
    out = capsys.readouterr().out
    assert "1 of 2 selected dead jobs replayed (left alone: 1 destination not allowed)" in out
    assert sql(database_url, "SELECT id, status::text FROM retry_jobs_all ORDER BY id") == [
        (1, "pending"),
        (2, "dead"),
    ]


def test_an_operation_larger_than_the_page_s_bound_is_refused_before_anything_is_written(
    database_url: str,
) -> None:
    insert(database_url, [dead_job(1), dead_job(2), dead_job(3)])
    dry = run_action(
        database_url,
        Operation(
            action="replay", selection=Selection(), actor="ann", source="ui", dry_run=True, max_affected=2
        ),
        deployment=deployment(),
    )
    assert dry.would_affect == 3  # a dry run only counts: always allowed
    with pytest.raises(
        DlqError, match="3 jobs is more than the 2 this page replays at once: trigger the dlq_replay DAG"
    ):
        run_action(
            database_url,
            Operation(
                action="replay",
                selection=Selection(),
                actor="ann",
                source="ui",
                dry_run=False,
                max_affected=2,
            ),
            deployment=deployment(),
        )
    assert {s for (s,) in sql(database_url, "SELECT status::text FROM retry_jobs_all")} == {"dead"}
    assert len(audit_rows(database_url)) == 1  # the dry run's only


@pytest.mark.parametrize(
    ("flt", "message"),
    [
        ({"limit": 10_000_001}, "limit must be a whole number from 1 to 10,000,000"),
        ({"ids": tuple(range(1, 10_002))}, "at most 10,000 ids"),
    ],
)
def test_limits_and_id_lists_are_bounded(flt: dict[str, Any], message: str) -> None:
    with pytest.raises(SelectionError, match=message):
        Selection(**flt)
