"""A publish round that stalls says where: its parts' seconds in one warning (SLOW_ROUND_S)."""

from __future__ import annotations

import logging
import re
import threading
import time

import psycopg
import pytest

from retry_scheduler.core.deployment import Deployment
from retry_scheduler.db.store import Store
from retry_scheduler.loops.counts import SLOW_ROUND_S
from retry_scheduler.loops.publish import Publisher
from tests.integration.test_loop import Loop, hdr, new_loop
from tests.kafkautil import consume, create_topics

pytestmark = pytest.mark.integration

#: How long the test keeps retry_published_jobs locked: past SLOW_ROUND_S.
LOCKED_S = SLOW_ROUND_S + 1.5


def test_a_round_held_up_by_a_lock_says_its_marks_took_the_time(
    database_url: str, bootstrap_servers: str, topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Another session holds retry_published_jobs in SHARE mode (a long report that locked it) while
    a round publishes: the broker acknowledges at once, the round's marks wait for the lock, and the
    warning gives the seconds to the marks, not to the claim or the broker. Nothing is lost."""
    loop: Loop = new_loop(database_url, bootstrap_servers, topic_prefix)
    create_topics(loop.bootstrap, [loop.dest])
    loop.send(
        [{"key": b"k", "value": b"v",
          "headers": hdr(original_topic=loop.dest, original_partition="0", original_offset="1",
                         at=str(int(time.time() * 1000)), group="g")}]
    )  # fmt: skip
    assert loop.ingest(1).stored == 1
    with psycopg.connect(database_url) as blocker:
        blocker.execute("LOCK TABLE retry_published_jobs IN SHARE MODE")
        release = threading.Timer(LOCKED_S, blocker.rollback)
        release.start()
        try:
            with Store(loop.settings.database_url) as store, caplog.at_level(logging.WARNING):
                publisher = Publisher(Deployment.load(loop.settings), store)
                try:
                    counts = publisher.publish_once()
                finally:
                    publisher.close()
        finally:
            release.join()
    assert counts.published == 1
    [said] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("slow publish round")]
    found = re.fullmatch(
        r"slow publish round: ([\d.]+) s for 1 jobs \((.*)marks and commit ([\d.]+) s\)", said
    )
    assert found is not None, said
    total, marks = float(found[1]), float(found[3])
    parts = {
        name: float(seconds) for name, seconds, _ in (p.rsplit(" ", 2) for p in found[2].split(", ") if p)
    }
    assert total >= LOCKED_S - 0.5 and marks >= LOCKED_S - 1.0, said
    assert parts.get("produce and acknowledgements", 0.0) < 1.0, said
    assert [m.value for m in consume(loop.bootstrap, [loop.dest], expected=1)] == [b"v"]
