"""Reprocessing a time window with the real ``airflow backfill create`` under the dev stack's scheduler.

The tests share one dev stack (broker, scheduler, dag processor, api-server; LocalExecutor). Each
empties the service's tables, resets its DAG's history in the metadata database (kept between test
runs), stores jobs in and around the window, backfills it with the ``airflow`` command an operator
types, and waits for the backfill to complete through the REST API. Then: the runs were created for
the asked intervals and no others, each processed exactly its own interval, and backfilling the
window again (``--reprocess-behavior completed``) changed nothing more.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest

from retry_scheduler.core.jobs import Status
from retry_scheduler.dev.airflow_api import api_token, dag_runs, fail_unfinished_runs, set_paused, unpause_dag
from retry_scheduler.dev.airflow_env import airflow_cli
from retry_scheduler.dev.stack import DevStack
from tests.airflow_rest import dag_details, wait_for_backfills
from tests.conftest import ROOT, empty_service_tables
from tests.e2e.stacks import new_dev_stack, reparse
from tests.integration.test_dlq import dead_job, insert, sql
from tests.jobrows import publish

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


@pytest.fixture(scope="module")
def module_stack(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    """One dev stack for the module's tests: each backfills a DAG of its own."""
    home = tmp_path_factory.mktemp("backfill")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RETRY_ARCHIVE_URI", (home / "archive").as_uri())
        with new_dev_stack(module_database_url, home, "retry_airflow_backfill_", triggerer=False) as stack:
            yield stack


@pytest.fixture
def stack(module_stack: DevStack) -> DevStack:
    """The module's stack with the service's tables and the archive empty: each test stores its own jobs."""
    empty_service_tables(module_stack.settings.database_url)
    shutil.rmtree(module_stack.env["RETRY_ARCHIVE_URI"].removeprefix("file://"), ignore_errors=True)
    return module_stack


def fresh_dag(stack: DevStack, dag_id: str, paused: bool = True) -> str:
    """Forget the DAG's runs and backfills of earlier test runs (the metadata database is kept
    between them), paused (by default, so that nothing runs before the backfill) or not.

    A run left unfinished by an earlier stack (its task still ``running``) would make ``airflow dags
    delete`` refuse: such runs are failed first. A DAG with no runs (a fresh database) is not deleted,
    which would only wait for the dag processor to parse it again.
    """
    token = api_token(stack.base_url)
    details = set_paused(stack.base_url, token, dag_id, paused)
    if dag_runs(stack.base_url, token, dag_id):
        fail_unfinished_runs(stack.base_url, token, dag_id)
        deleted = airflow_cli(["dags", "delete", dag_id, "--yes"], stack.env, check=False)
        assert deleted.returncode == 0, (deleted.stdout + deleted.stderr)[-2000:]
        reparse(stack, f"{dag_id}.py")
        details = set_paused(stack.base_url, token, dag_id, paused)  # once parsed again
    assert details["is_paused"] is paused
    assert dag_runs(stack.base_url, token, dag_id) == []
    return token


def backfill(stack: DevStack, dag_id: str, start: datetime, end: datetime, *extra: str) -> None:
    done = airflow_cli(
        ["backfill", "create", "--dag-id", dag_id, "--from-date", start.isoformat(), "--to-date", end.isoformat(),
         *extra],
        stack.env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


def intervals(runs: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(r["data_interval_start"], r["data_interval_end"], r["state"]) for r in runs]


def iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def documented_window_replay(start: datetime, end: datetime) -> list[list[str]]:
    """The user guide's commands to reprocess an outage's window (``docs/guide/dead-letters.md``), as
    an operator copies them, with the dates of the window put in place of the example dates."""
    import re
    import shlex

    text = (ROOT / "docs" / "guide" / "dead-letters.md").read_text()
    section = text[text.index("## Reprocess an outage's window by backfilling") :]
    block = section[
        section.index("```bash\n") + len("```bash\n") : section.index("\n```", section.index("```bash"))
    ]
    commands = []
    for line in re.sub(r"\\\n\s*", " ", block).splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[0] == "airflow", line
        dates = iter((start.isoformat(), end.isoformat()))
        words = [next(dates) if re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:]+\+00:00", w) else w for w in words]
        commands.append(words[1:])
    return commands


def test_the_documented_backfill_replays_an_hour_that_has_just_ended_whatever_the_scheduler_did(
    stack: DevStack,
) -> None:
    database_url = stack.settings.database_url
    # Created unpaused (is_paused_upon_creation): as it is in a new deployment.
    token = fresh_dag(stack, "dlq_window_replay", paused=False)
    now = datetime.now(UTC)
    current = now.replace(minute=0, second=0, microsecond=0)
    hours = [current - timedelta(hours=3 - h) for h in range(3)]  # the last of them has just ended
    # Per hour of the window, 1, 2 and 3 dead jobs; one just before the window and one after it.
    placed = {1: hours[0], 2: hours[1], 3: hours[1] + timedelta(minutes=59, seconds=59), 4: hours[2],
              5: hours[2] + timedelta(minutes=30), 6: hours[2] + timedelta(minutes=59, seconds=59),
              7: hours[0] - timedelta(microseconds=1), 8: current}  # fmt: skip
    insert(database_url, [dead_job(offset, destination="payments") for offset in placed])
    for offset, at in placed.items():
        sql(database_url, "UPDATE retry_jobs SET dead_at = %s WHERE source_offset = %s", at, offset)

    # What the scheduler does meanwhile, unpaused: nothing of its own that could take an hour first
    # (before, it made the hour that had just ended a dry run, and the backfill skipped that hour).
    unpause_dag(stack.base_url, token, "dlq_window_replay")
    reparse(stack, "dlq_window_replay.py")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert dag_runs(stack.base_url, token, "dlq_window_replay") == []
        time.sleep(2)
    assert dag_details(stack.base_url, token, "dlq_window_replay")["next_dagrun_logical_date"] is None

    # The documented commands, exactly as written, for these hours.
    commands = documented_window_replay(hours[0], hours[2])
    assert [c[:2] for c in commands] == [["dags", "unpause"], ["backfill", "create"]]
    for command in commands:
        done = airflow_cli(command, stack.env)
        assert done.returncode == 0, done.stderr[-2000:]
    wait_for_backfills(stack.base_url, token, "dlq_window_replay")

    runs = dag_runs(stack.base_url, token, "dlq_window_replay")
    assert intervals(runs) == [(iso(h), iso(h + timedelta(hours=1)), "success") for h in hours]
    assert {r["run_type"] for r in runs} == {"backfill"}
    audit = sql(
        database_url,
        "SELECT run_id, filter->>'since', filter->>'until', dry_run, actor, affected FROM retry_dlq_audit"
        " ORDER BY filter->>'since'",
    )
    assert [(a[0], a[3], a[5]) for a in audit] == [
        (r["dag_run_id"], False, n) for r, n in zip(runs, (1, 2, 3), strict=True)
    ]
    assert [(a[1], a[2]) for a in audit] == [
        (h.isoformat(), (h + timedelta(hours=1)).isoformat()) for h in hours
    ]
    assert audit[0][4] and {a[4] for a in audit} == {audit[0][4]}  # the user who typed the backfill command
    assert sql(database_url, "SELECT source_offset FROM retry_jobs_all WHERE status = 'dead' ORDER BY 1") == [
        (7,),
        (8,),
    ]

    # The same commands again: every run of the window runs again, and nothing more is replayed.
    for command in commands:
        assert airflow_cli(command, stack.env).returncode == 0
    backfills = wait_for_backfills(stack.base_url, token, "dlq_window_replay")
    assert len(backfills) == 2
    again = sql(
        database_url, "SELECT filter->>'since', affected FROM retry_dlq_audit ORDER BY filter->>'since', id"
    )
    assert again == [
        (h.isoformat(), n) for h, first_n in zip(hours, (1, 2, 3), strict=True) for n in (first_n, 0)
    ]
    assert intervals(dag_runs(stack.base_url, token, "dlq_window_replay")) == intervals(runs)
    assert sql(database_url, "SELECT count(*) FROM retry_jobs_all WHERE status = 'pending'") == [(6,)]


# Four Spark jobs, one after another, through the scheduler (and each backfill may take 900 s).
@pytest.mark.timeout(1800)
def test_backfilling_retry_compaction_archives_each_day_once(stack: DevStack) -> None:
    database_url = stack.settings.database_url
    archive = Path(stack.env["RETRY_ARCHIVE_URI"].removeprefix("file://"))
    token = fresh_dag(stack, "retry_compaction")
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    days = [today - timedelta(days=2), today - timedelta(days=1)]
    before = today - timedelta(days=3)
    # 4 jobs published on the first day, 6 on the second, 3 on the day before the range.
    published = [(days[0], 4), (days[1], 6), (before, 3)]
    offsets = iter(range(1, 100))
    for day, count in published:
        batch = [next(offsets) for _ in range(count)]
        insert(database_url, [replace(dead_job(o), status=Status.PENDING, dead_reason=None) for o in batch])
        with psycopg.connect(database_url) as conn:
            publish(conn, "source_offset = ANY(%s)", (batch,), at=day + timedelta(hours=12))

    backfill(stack, "retry_compaction", days[0], days[1])
    # Catch-up starts after the newest run the DAG has: once the dag processor saw the backfill's runs,
    # unpausing creates no scheduled run for the days before them.
    dag_details(stack.base_url, token, "retry_compaction")
    reparse(stack, "retry_compaction.py")
    wait_until_next_run_after(stack, token, "retry_compaction", days[1])
    unpause_dag(stack.base_url, token, "retry_compaction")
    wait_for_backfills(stack.base_url, token, "retry_compaction", timeout=900)

    runs = window_runs(stack, token, today)
    assert intervals(runs) == [(iso(d), iso(d + timedelta(days=1)), "success") for d in days]
    assert {r["run_type"] for r in runs} == {"backfill"}

    def archived() -> list[tuple[str, int]]:
        table = pq.read_table(archive / "retry_jobs")
        return sorted(
            (day, table.column("day").to_pylist().count(day)) for day in set(table.column("day").to_pylist())
        )

    expected = [(days[0].strftime("%Y-%m-%d"), 4), (days[1].strftime("%Y-%m-%d"), 6)]
    assert archived() == expected
    left = [(before + timedelta(hours=12), 3)]
    assert sql(database_url, "SELECT published_at, count(*) FROM retry_jobs_all GROUP BY 1") == left

    backfill(stack, "retry_compaction", days[0], days[1], "--reprocess-behavior", "completed")
    assert len(wait_for_backfills(stack.base_url, token, "retry_compaction", timeout=900)) == 2
    assert intervals(window_runs(stack, token, today)) == intervals(runs)
    assert archived() == expected  # no row twice
    assert sql(database_url, "SELECT published_at, count(*) FROM retry_jobs_all GROUP BY 1") == left


def window_runs(stack: DevStack, token: str, today: datetime) -> list[dict[str, Any]]:
    """The compaction runs for days before ``today``: all but the scheduled run the unpaused DAG
    creates for today when the test crosses midnight (UTC), which is no business of the backfill."""
    runs = dag_runs(stack.base_url, token, "retry_compaction")
    return [
        r for r in runs if datetime.fromisoformat(r["data_interval_start"].replace("Z", "+00:00")) < today
    ]


def wait_until_next_run_after(stack: DevStack, token: str, dag_id: str, day: datetime) -> None:
    import time

    deadline = time.monotonic() + 120
    while True:
        upcoming = dag_details(stack.base_url, token, dag_id).get("next_dagrun_logical_date")
        if upcoming and datetime.fromisoformat(upcoming.replace("Z", "+00:00")) > day:
            return
        assert time.monotonic() < deadline, f"{dag_id}'s next run is still {upcoming}"
        time.sleep(2)
