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
#: Where the retry goes: ``topic`` (back to the destination, every group reads it) or ``group`` (to
#: the failing group's redelivery topic, :func:`redelivery_topic`).
SCOPE: Final = "retry.scope"
#: Ordered mode (the consumer helper's): on a record parked behind an earlier record of its key, the id
#: of the key's chain it waits in. Published back with it, so the helper knows a record of its chain.
#: (0.4.0's helper named the chain by the ``retry.id`` of the record it waited behind.)
HOLD: Final = "retry.hold"
#: On the consumer helper's release record: the chain whose held records may now be published, one at a
#: time, in their original order.
RELEASE: Final = "retry.release"
#: On the retry of a record that failed in ordered mode: the chain it heads. The chain's records wait
#: while it is pending (its retry stored, its release withdrawn); it dies, and the chain is released as
#: dead. Kept with the record's own headers, so it comes back with the retry.
BLOCKS: Final = "retry.blocks"
#: How a chain was released: on a held record the scheduler publishes, ``released`` (its head was
#: handled) or ``dead:<retry.id>`` (that head died); on a record the helper parks, ``released``: the
#: chain is flowing, so the record goes out in its turn.
CHAIN_STATE: Final = "retry.chain-state"
CHAIN_RELEASED: Final = "released"
CHAIN_DEAD: Final = "dead"
#: On a record the scheduler publishes, for the consumer helper only, to a group's redelivery topic
#: when the head of a chain died there (``retry.notice: head-dead``, with ``retry.hold`` and
#: ``retry.chain-state: dead:<retry.id>``, no value): the helper learns of the death even when no
#: record of the key waits behind it, frees the key, and never hands the notice to the handler. Set
#: by the scheduler only; not one of :data:`KNOWN` (it is stored with the notice's own headers).
NOTICE: Final = "retry.notice"
NOTICE_HEAD_DEAD: Final = "head-dead"
#: ``dead:*``: a chain released by the scheduler (an operator's ``chains release``, a policy's max_age)
#: whatever head the consumer waits for.
CHAIN_ANY_HEAD: Final = "*"

PREFIX: Final = "retry."

#: The compacted topic the consumer helper's ordered mode keeps its holds in, unless told another;
#: never a destination (``RETRY_HOLDS_TOPICS`` names the others).
HOLDS_TOPIC: Final = "retry.holds"

SEND_TO_RETRY: Final = "retry"
SEND_TO_DLQ: Final = "dlq"

SCOPE_TOPIC: Final = "topic"
SCOPE_GROUP: Final = "group"
REDELIVERY_SUFFIX: Final = ".redelivery"

DEAD_EXHAUSTED: Final = "exhausted"
DEAD_EXPIRED: Final = "expired"
DEAD_FATAL: Final = "fatal"
DEAD_REQUESTED: Final = "requested"
DEAD_INVALID: Final = "invalid"
#: Read from another tool's dead-letter topic (Spring Kafka, Kafka Connect): ``core/adopt.py``.
DEAD_ADOPTED: Final = "adopted"
#: Replayed from the dead letters RETRY_PARK_AFTER_REPLAYS times and dead again each time: a replay
#: leaves it alone unless asked for it (its dead reason, or its id).
DEAD_PARKED: Final = "parked"
DEAD_REASONS: Final = (
    DEAD_EXHAUSTED, DEAD_EXPIRED, DEAD_FATAL, DEAD_REQUESTED, DEAD_INVALID, DEAD_ADOPTED, DEAD_PARKED,
)  # fmt: skip
#: How many times a record went back from the dead letters (a replay or a bulk retry of dead jobs),
#: set by the scheduler on the replayed record. Not one of :data:`KNOWN`: it travels with the record's
#: own headers, so an application (or the SDK) that copies them into its retry carries it back.
REPLAYS: Final = "retry.replays"

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
        SCOPE,
        HOLD,
        RELEASE,
        BLOCKS,
        CHAIN_STATE,
    }
)

#: Kafka's own rule for topic names (legal characters, 1-249 of them).
TOPIC_PATTERN: Final = r"[A-Za-z0-9._-]{1,249}"
TOPIC_NAME: Final = re.compile(TOPIC_PATTERN)


def redelivery_topic(topic: str, group: str) -> str:
    """The topic only ``group`` reads for its retries of records from ``topic``: ``{topic}.{group}.redelivery``.

    Raises ``ValueError`` when the group cannot be part of a topic name, or the name is too long.
    """
    name = f"{topic}.{group}{REDELIVERY_SUFFIX}"
    if not group or not TOPIC_NAME.fullmatch(group) or not TOPIC_NAME.fullmatch(name):
        raise ValueError(
            f"group {group[:60]!r} of topic {topic[:60]!r} gives no topic name for its redelivery topic "
            "([A-Za-z0-9._-], 249 characters in all)"
        )
    return name


def redelivery_bases(topic: str) -> list[str]:
    """The topics ``topic`` may be the redelivery topic of (a group name may hold dots); none when it is not one."""
    if not topic.endswith(REDELIVERY_SUFFIX):
        return []
    stem = topic[: -len(REDELIVERY_SUFFIX)]
    return [stem[:i] for i, char in enumerate(stem) if char == "." and 0 < i < len(stem) - 1]
