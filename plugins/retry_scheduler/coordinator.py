"""Reading a group's committed offsets while its coordinator loads or moves.

A Kafka broker answers ``NOT_COORDINATOR`` or ``COORDINATOR_LOAD_IN_PROGRESS`` while the partition of
``__consumer_offsets`` that holds a group is created, loaded or moves to another broker (a new cluster's
first group, a broker restart, a leader failover). librdkafka's ``committed()`` hands those answers to
the caller; they pass in seconds, so the read is tried again. Used by the ingest and by the SDK's
consumer helper, hence confluent-kafka only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

log = logging.getLogger(__name__)

#: The answers that mean "ask again shortly", not "there is no such offset".
RETRIABLE = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
    }
)


def committed_offsets(
    consumer: Consumer, partitions: Sequence[TopicPartition], timeout_s: float = 30.0
) -> list[TopicPartition]:
    """``consumer.committed(partitions)``, asked again while the group's coordinator is loading or
    moving, for ``timeout_s`` at most; then the last error is raised."""
    deadline = time.monotonic() + timeout_s
    pause = 0.1
    while True:
        try:
            return list(consumer.committed(list(partitions), timeout=max(1.0, deadline - time.monotonic())))
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if error is None or error.code() not in RETRIABLE or time.monotonic() + pause > deadline:
                raise
            log.info("the group coordinator is not ready (%s): asking again in %.1f s", error.name(), pause)
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
