"""Names of the header protocol (DESIGN.md). Imported by the SDK, so standard library only."""

from __future__ import annotations

import re
from typing import Final

DESTINATION: Final = "retry.destination"
ORIGINAL_TOPIC: Final = "retry.original-topic"
ORIGINAL_PARTITION: Final = "retry.original-partition"
ORIGINAL_OFFSET: Final = "retry.original-offset"
ORIGINAL_TIMESTAMP: Final = "retry.original-timestamp"
ATTEMPT: Final = "retry.attempt"
AT: Final = "retry.at"
POLICY: Final = "retry.policy"
REASON: Final = "retry.reason"
ERROR_CLASS: Final = "retry.error-class"
GROUP: Final = "retry.group"
SEND_TO: Final = "retry.send-to"
ID: Final = "retry.id"
DEAD_REASON: Final = "retry.dead-reason"

PREFIX: Final = "retry."

SEND_TO_RETRY: Final = "retry"
SEND_TO_DLQ: Final = "dlq"

DEAD_EXHAUSTED: Final = "exhausted"
DEAD_EXPIRED: Final = "expired"
DEAD_FATAL: Final = "fatal"
DEAD_REQUESTED: Final = "requested"
DEAD_INVALID: Final = "invalid"
#: Read from another tool's dead-letter topic (Spring Kafka, Kafka Connect): ``core/adopt.py``.
DEAD_ADOPTED: Final = "adopted"
DEAD_REASONS: Final = (DEAD_EXHAUSTED, DEAD_EXPIRED, DEAD_FATAL, DEAD_REQUESTED, DEAD_INVALID, DEAD_ADOPTED)

#: Headers the scheduler understands; every other header passes through byte for byte.
KNOWN: Final = frozenset(
    {
        DESTINATION,
        ORIGINAL_TOPIC,
        ORIGINAL_PARTITION,
        ORIGINAL_OFFSET,
        ORIGINAL_TIMESTAMP,
        ATTEMPT,
        AT,
        POLICY,
        REASON,
        ERROR_CLASS,
        GROUP,
        SEND_TO,
        ID,
        DEAD_REASON,
    }
)

#: Kafka's own rule for topic names (legal characters, 1-249 of them).
TOPIC_PATTERN: Final = r"[A-Za-z0-9._-]{1,249}"
TOPIC_NAME: Final = re.compile(TOPIC_PATTERN)
