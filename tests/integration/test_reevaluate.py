"""Dead ``invalid`` jobs re-evaluated after the configuration that made them invalid is fixed.

Against the real PostgreSQL and the embedded broker: records stored invalid by the ingest loop (a
destination not yet allowed, a policy not yet deployed), then ``retry-scheduler dlq replay
--reevaluate`` with the fixed policies module, as an operator runs it, then the publish loop.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from retry_scheduler.cli.main import main
from tests.integration.test_loop import Loop, hdr, new_loop
from tests.kafkautil import consume

pytestmark = pytest.mark.integration


@pytest.fixture
def loop(database_url: str, bootstrap_servers: str, topic_prefix: str) -> Iterator[Loop]:
    yield new_loop(database_url, bootstrap_servers, topic_prefix)


def _dead(loop: Loop) -> list[tuple[str | None, str, str]]:
    with psycopg.connect(loop.settings.database_url) as conn:
        rows = conn.execute(
            "SELECT destination, status::text, coalesce(dead_reason, '') FROM retry_jobs_all ORDER BY id"
        ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def test_invalid_jobs_pass_after_the_configuration_is_fixed_and_keep_their_bytes(
    loop: Loop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    late = f"{loop.dest.rsplit('-', 1)[0]}_late"  # outside the loop's allowlist: not allowed at ingest
    never = f"{loop.dest.rsplit('-', 1)[0]}_never"
    loop.send(
        [
            {"key": b"k1", "value": b"\x00one\xff", "headers": [("trace", b"t1"), *hdr(destination=late)]},
            {"key": b"k2", "value": b"two", "headers": hdr(destination=loop.dest, policy="gold")},
            {"key": b"k3", "value": b"three", "headers": hdr(destination=never)},
        ]
    )
    counts = loop.ingest(3)
    assert (counts.stored, counts.pending) == (3, 0) and counts.dead == {"invalid": 3}

    module = tmp_path / "retry_policies.py"  # the fix: the destination allowed, the policy deployed
    module.write_text(
        "from retry_scheduler.core.policy import Policy\n"
        f'POLICIES = [Policy("default", delays=["1s"], max_attempts=2, dlq_topic="{loop.dest}-dlq"),\n'
        f'            Policy("gold", delays=["1s"], max_attempts=9, dlq_topic="{loop.dest}-dlq")]\n'
        f'ALLOWED_DESTINATIONS = ["{late}"]\n'
    )
    for name, value in {
        "RETRY_DATABASE_URL": loop.settings.database_url,
        "RETRY_POLICIES": str(module),
        "RETRY_DESTINATION_ALLOWLIST": loop.settings.destination_allowlist,
    }.items():
        monkeypatch.setenv(name, value)

    assert main(["dlq", "replay", "--reevaluate", "--dry-run"]) == 0
    assert (
        "dry run: 2 of 3 selected dead jobs would be re-evaluated and made pending (left alone: 1 still invalid)"
        in (capsys.readouterr().out)
    )
    assert [r[1] for r in _dead(loop)] == ["dead", "dead", "dead"]  # a dry run changes nothing
    assert main(["dlq", "replay", "--reevaluate", "--yes"]) == 0
    assert "2 of 3 selected dead jobs re-evaluated and made pending (left alone: 1 still invalid)" in (
        capsys.readouterr().out
    )
    assert sorted(_dead(loop), key=str) == sorted(
        [(late, "pending", ""), (loop.dest, "pending", ""), (None, "dead", "invalid")], key=str
    )

    published = loop.publish(4, policies_path=str(module))
    assert published.published == 2
    [one] = consume(loop.bootstrap, [late], 1)
    assert (one.key, one.value, one.headers[0]) == (b"k1", b"\x00one\xff", ("trace", b"t1"))
    assert one.header("retry.attempt") == "1"
    [two] = consume(loop.bootstrap, [loop.dest], 1)
    assert (two.key, two.value) == (b"k2", b"two")
    with psycopg.connect(loop.settings.database_url) as conn:
        [(reason,)] = conn.execute("SELECT reason FROM retry_jobs WHERE status = 'dead'").fetchall()
        [(policy,)] = conn.execute(
            "SELECT policy FROM retry_published_jobs WHERE destination = %s", (loop.dest,)
        ).fetchall()
        [audit] = conn.execute(
            "SELECT action, dry_run, matched, affected, skipped FROM retry_dlq_audit ORDER BY id DESC LIMIT 1"
        ).fetchall()
    assert f"destination '{never}' is not allowed" in reason  # what the current configuration says
    assert policy == "gold"
    assert audit == ("reevaluate", False, 3, 2, {"still invalid": 1})


def test_a_letter_dead_by_the_old_repeated_header_rule_is_made_pending(
    loop: Loop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before the last-occurrence rule, a record carrying a retry header twice (the Java example's
    second failure) was stored dead, invalid, with its headers whole: such a letter, as an older
    version stored it, passes re-evaluation now and is published once."""
    from retry_scheduler.core.jobs import encode_headers

    headers = [("trace", b"t"), *hdr(original_topic=loop.dest, attempt="1"), *hdr(original_topic=loop.dest)]
    with psycopg.connect(loop.settings.database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO retry_jobs (source_topic, source_partition, source_offset, source_timestamp_ms, msg_key,"
            " msg_value, headers, attempt, policy, reason, retry_id, first_seen_at, due_at, status, dead_reason,"
            " dlq_topic, dead_at) VALUES (%s, 0, 7, %s, 'k', 'v', %s, 0, 'default', %s, 'r-1', now(), now(), 'dead',"
            " 'invalid', 'retry.dlq', now())",
            (loop.settings.retry_topic, int(time.time() * 1000), encode_headers(headers),
             "header retry.original-topic appears more than once"),
        )  # fmt: skip
    module = tmp_path / "retry_policies.py"
    module.write_text(
        "from retry_scheduler.core.policy import Policy\n"
        f'POLICIES = [Policy("default", delays=["0s"], max_attempts=5, dlq_topic="{loop.dest}-dlq")]\n'
    )
    monkeypatch.setenv("RETRY_DATABASE_URL", loop.settings.database_url)
    monkeypatch.setenv("RETRY_POLICIES", str(module))
    monkeypatch.setenv("RETRY_DESTINATION_ALLOWLIST", loop.settings.destination_allowlist)
    assert main(["dlq", "replay", "--reevaluate", "--search", "appears more than once", "--yes"]) == 0
    assert "1 of 1 selected dead jobs re-evaluated and made pending" in capsys.readouterr().out
    assert loop.publish(4, policies_path=str(module)).published == 1
    [seen] = consume(loop.bootstrap, [loop.dest], 1)
    assert (seen.key, seen.value, seen.header("retry.attempt"), seen.header("trace")) == (
        b"k",
        b"v",
        "2",
        "t",
    )
