"""A paced replay (issue 33): at most ``rate`` jobs of each destination fall due per second, across
batches, and the publish loop sends each when due, never early. The default paces only large replays,
and every way in says which pace it took.

Against the real PostgreSQL and the embedded broker.
"""

from __future__ import annotations

import itertools
import json
from datetime import datetime

import pytest

from retry_scheduler.cli.main import main
from retry_scheduler.core.config import Settings
from retry_scheduler.db.selection import Selection
from retry_scheduler.ops.dlq import DEFAULT_REPLAY_RATE, UNPACED_UP_TO, Operation, run_action
from tests.conftest import TEST_DESTINATIONS
from tests.integration.test_dlq import dead_job, deployment, insert, publish_for, sql
from tests.kafkautil import consume, create_topics

pytestmark = pytest.mark.integration


def replay(selection: Selection | None = None, **changes: object) -> Operation:
    fields: dict[str, object] = {
        "action": "replay", "selection": selection or Selection(), "actor": "ann", "source": "cli", "dry_run": False,
    }  # fmt: skip
    return Operation(**{**fields, **changes})  # type: ignore[arg-type]


def due_times(database_url: str, destination: str) -> list[datetime]:
    return [
        row[0]
        for row in sql(
            database_url, "SELECT due_at FROM retry_jobs WHERE destination = %s ORDER BY id", destination
        )
    ]


def test_a_paced_replay_spaces_each_destinations_jobs_across_batches(database_url: str) -> None:
    """20 jobs of one destination and 10 of another, in batches of 7, at 10/s: each destination's
    n-th job is due (n - 1) / 10 s after the first, whatever batch it was in; the outcome and the
    audit say the pace."""
    jobs = [dead_job(i, destination="orders" if i % 3 else "payments") for i in range(1, 31)]
    insert(database_url, jobs)

    outcome = run_action(database_url, replay(rate_per_s=10), deployment=deployment(), batch_size=7)

    assert (outcome.affected, outcome.rate_per_s, outcome.default_pace) == (30, 10.0, False)
    assert outcome.paced_s == pytest.approx(1.9)  # 20 orders: the last 1.9 s after the first
    assert "paced at 10 jobs/s per destination: the last falls due about 2 s after the start" in (
        outcome.summary()
    )
    for destination, count in (("orders", 20), ("payments", 10)):
        due = due_times(database_url, destination)
        assert len(due) == count
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(due)]
        assert all(g == pytest.approx(0.1, abs=1e-5) for g in gaps), (destination, gaps)
    first = {d: due_times(database_url, d)[0] for d in ("orders", "payments")}
    assert abs((first["orders"] - first["payments"]).total_seconds()) < 0.5  # both start at once
    assert sql(database_url, "SELECT rate_per_s FROM retry_dlq_audit ORDER BY id DESC LIMIT 1") == [(10.0,)]


def test_the_default_paces_only_a_replay_larger_than_its_bound(database_url: str) -> None:
    """Up to UNPACED_UP_TO jobs of a destination: all due at once; one more: paced at
    DEFAULT_REPLAY_RATE, and the dry run says so; a rate of 0 asks for no pace."""
    insert(database_url, [dead_job(i) for i in range(1, UNPACED_UP_TO + 2)])
    small = run_action(
        database_url, replay(Selection(limit=UNPACED_UP_TO), dry_run=True), deployment=deployment()
    )
    large = run_action(database_url, replay(dry_run=True), deployment=deployment())
    unpaced = run_action(database_url, replay(dry_run=True, rate_per_s="unlimited"), deployment=deployment())

    assert (small.rate_per_s, small.default_pace) == (None, True)
    assert (
        "not paced: every job due at once (the default up to 10,000 jobs per destination)" in small.summary()
    )
    assert (large.rate_per_s, large.paced_s, large.default_pace) == (DEFAULT_REPLAY_RATE, 10.0, True)
    assert (
        "paced at 1,000 jobs/s per destination (the default for a replay of more than 10,000 jobs of a "
        "destination; give a rate to change it, 0 for none): the last would fall due about 10 s after"
    ) in large.summary()
    assert (unpaced.rate_per_s, unpaced.default_pace) == (None, False)
    assert "not paced: every job due at once [audit" in unpaced.summary()


def test_paced_jobs_go_out_when_due_never_early(
    database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    """Through the real publish loop: 12 jobs at 4/s fall due over 2.75 s and each is acknowledged at
    or after its due time (those due before the publisher started go at once), every one on the
    destination topic once."""
    dest = f"{topic_prefix}.orders"
    create_topics(bootstrap_servers, [dest])
    settings = Settings(
        database_url=database_url,
        kafka={"bootstrap.servers": bootstrap_servers},
        destination_allowlist=TEST_DESTINATIONS,
        create_topics=True,
        loop_grace_ms=0,
    )
    insert(database_url, [dead_job(i, destination=dest) for i in range(1, 13)])

    run_action(database_url, replay(rate_per_s=4), deployment=deployment())
    publish_for(settings, 5)

    rows = sql(
        database_url,
        "SELECT extract(epoch FROM published_at - due_at)::float8, extract(epoch FROM published_at)::float8, "
        "extract(epoch FROM due_at)::float8 FROM retry_jobs_all WHERE status = 'published' ORDER BY id",
    )
    assert len(rows) == 12
    assert all(late >= 0 for late, _at, _due in rows), rows  # none early
    # the last went out no sooner than 2.75 s after the first fell due: spread by the pace, not at once
    assert rows[-1][1] - rows[0][2] >= 2.74, rows
    assert len(consume(bootstrap_servers, [dest], 12)) == 12


def test_the_command_line_paces_a_replay_and_refuses_a_bad_rate(
    database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RETRY_DATABASE_URL", database_url)
    insert(database_url, [dead_job(i) for i in range(1, 6)])

    assert main(["dlq", "replay", "--all", "--rate", "2", "--yes", "--json"]) == 0
    out = capsys.readouterr().out  # the dry run's JSON, then the run's
    dry, end = json.JSONDecoder().raw_decode(out)
    outcome = json.loads(out[end:])
    assert (dry["dry_run"], dry["rate_per_s"]) == (True, 2.0)
    assert (outcome["affected"], outcome["rate_per_s"], outcome["paced_s"]) == (5, 2.0, 2.0)
    due = due_times(database_url, "orders")
    assert (due[-1] - due[0]).total_seconds() == pytest.approx(2.0, abs=1e-5)

    assert main(["dlq", "replay", "--all", "--rate", "fast", "--yes"]) == 2
    assert "rate 'fast' must be jobs per second per destination" in capsys.readouterr().err
    assert main(["dlq", "replay", "--reevaluate", "--rate", "5"]) == 2
    assert "--rate does not go with --reevaluate" in capsys.readouterr().err
