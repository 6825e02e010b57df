"""Records built as a non-Python client builds them, through three failures.

The header reference's Java example copies every header of the failed record and adds the retry
headers; on a record's second failure those are repeated. Against the real PostgreSQL and the embedded
broker, the records are built here the same two ways with confluent-kafka: the way the example was
written before (copy everything, add the retry headers again) and the way it is written now (copy
everything, keep the original-* headers a retry already carries, replace the per-failure ones).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import psycopg
import pytest

from retry_scheduler.core import protocol as p
from retry_scheduler.core.policy import Policy, PolicyRegistry
from tests.integration.test_loop import Loop, new_loop
from tests.kafkautil import Seen, consume, create_topics, produce

pytestmark = pytest.mark.integration

Headers = list[tuple[str, bytes | None]]


def naive_java(failed: Seen, failure: int) -> Headers:
    """``failed.headers().forEach(retry.headers()::add)`` and then ``.add("retry.original-topic", ...)``
    and the rest, as the example did before: every retry header repeated from the second failure on."""
    return [
        *failed.headers,
        (p.ORIGINAL_TOPIC, failed.topic.encode()),
        (p.ORIGINAL_PARTITION, str(failed.partition).encode()),
        (p.ORIGINAL_OFFSET, str(failed.offset).encode()),
        (p.REASON, f"failure {failure}".encode()),
        (p.ERROR_CLASS, b"java.net.SocketTimeoutException"),
        (p.GROUP, b"orders-app"),
    ]


def documented_java(failed: Seen, failure: int) -> Headers:
    """The example as the header reference writes it now: the original-* headers only when the failed
    record has none (its first failure), ``remove`` then ``add`` for the per-failure ones."""
    out = list(failed.headers)
    if not any(k == p.ORIGINAL_TOPIC for k, _ in out):
        out += [
            (p.ORIGINAL_TOPIC, failed.topic.encode()),
            (p.ORIGINAL_PARTITION, str(failed.partition).encode()),
            (p.ORIGINAL_OFFSET, str(failed.offset).encode()),
        ]
    for name, value in ((p.REASON, f"failure {failure}".encode()),
                        (p.ERROR_CLASS, b"java.net.SocketTimeoutException"), (p.GROUP, b"orders-app")):  # fmt: skip
        out = [(k, v) for k, v in out if k != name] + [(name, value)]
    return out


@pytest.mark.parametrize("build", [naive_java, documented_java], ids=["copied-and-added", "as-documented"])
def test_a_record_retried_three_times_by_a_client_copying_its_headers_comes_back_each_time(
    database_url: str, bootstrap_servers: str, topic_prefix: str, build: Callable[[Seen, int], Headers]
) -> None:
    """Each failure's record is built from the record the consumer failed on (the original, then each
    retry the service published): it comes back each time with the attempt raised and the same
    retry.id, every header once, the pass-through header kept; no job goes dead. (Before, the second
    failure's record was stored dead, invalid: "header retry.original-topic appears more than once".)"""
    loop: Loop = new_loop(database_url, bootstrap_servers, topic_prefix)
    loop = dataclasses.replace(
        loop,
        registry=PolicyRegistry.of(
            [Policy("default", delays=["1s"], max_attempts=5, dlq_topic=f"{topic_prefix}-dlq")]
        ),
    )
    create_topics(loop.bootstrap, [loop.dest])
    produce(loop.bootstrap, loop.dest, [{"key": b"order-42", "value": b"{}", "headers": [("trace", b"t-1")]}])
    [original] = consume(loop.bootstrap, [loop.dest], 1)
    failed, seen = original, [original]
    for failure in (1, 2, 3):
        loop.send([{"key": failed.key, "value": failed.value, "headers": build(failed, failure)}])
        assert loop.ingest(1).pending == 1, f"failure {failure}: not stored pending"
        time.sleep(1.1)  # the policy's delay
        assert loop.publish(3).published == 1, f"failure {failure}: not published"
        seen = consume(loop.bootstrap, [loop.dest], failure + 1)
        failed = max(seen, key=lambda s: s.offset)
        names = [k for k, _ in failed.headers]
        assert len(names) == len(set(names)), f"failure {failure}: a header repeated: {names}"
        assert failed.header(p.ATTEMPT) == str(failure)
        assert failed.header("trace") == "t-1"
        assert failed.header(p.ORIGINAL_TOPIC) == loop.dest
    assert len(seen) == 4 and len({s.header(p.ID) for s in seen[1:]}) == 1
    if build is documented_java:
        assert failed.header(p.ORIGINAL_OFFSET) == str(original.offset), "the first failure's offset is kept"
    with psycopg.connect(loop.settings.database_url) as conn:
        rows = conn.execute("SELECT status::text, attempt, reason FROM retry_jobs_all ORDER BY id").fetchall()
    assert rows == [("published", n, f"failure {n + 1}") for n in range(3)], rows
