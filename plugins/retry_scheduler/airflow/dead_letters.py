"""Start a DAG when dead letters appear: an Asset whose watcher reads the DLQ topics.

:func:`dead_letters_asset` gives an :class:`~airflow.sdk.Asset` with an ``AssetWatcher`` running the
Kafka provider's ``AwaitMessageTrigger`` in Airflow's triggerer. Each record on a DLQ topic becomes
an asset event whose ``extra["payload"]`` is :func:`dead_letter_event`'s summary of it; a DAG
scheduled on the asset runs on those events::

    from retry_scheduler.airflow.dead_letters import dead_letters_asset

    DEAD_LETTERS = dead_letters_asset(["retry.dlq"])

    @dag(schedule=[DEAD_LETTERS])
    def on_dead_letters():
        @task
        def triage(triggering_asset_events=None):
            for event in triggering_asset_events[DEAD_LETTERS]:
                letter = event.extra["payload"]  # retry_id, destination, dead_reason, reason...

The trigger consumes with the connection ``retry_dlq_watch`` (type kafka): its extra is the
consumer's configuration, which must name a ``group.id`` of the watcher's own (its offsets say which
dead letters were seen) and should say ``"auto.offset.reset": "latest"`` (a new watcher starts with
the dead letters to come, not the whole history of the topic). The example DAG is
``examples/dags/on_dead_letters.py``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from retry_scheduler.core import protocol

if TYPE_CHECKING:
    from airflow.sdk import Asset

#: The Kafka connection of the watcher (its extra: the consumer configuration, with a group.id).
WATCH_CONN_ID = "retry_dlq_watch"
#: The asset's default name.
ASSET_NAME = "retry_scheduler_dead_letters"
#: A header value is cut to this many characters in the event: a dead letter is hostile input.
MAX_TEXT = 500
_FIELDS = {
    protocol.ID: "retry_id",
    protocol.DESTINATION: "destination",
    protocol.ORIGINAL_TOPIC: "original_topic",
    protocol.DEAD_REASON: "dead_reason",
    protocol.REASON: "reason",
    protocol.ERROR_CLASS: "error_class",
    protocol.ATTEMPT: "attempt",
    protocol.GROUP: "group",
}


def _text(raw: object) -> str | None:
    if raw is None:
        return None
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes | bytearray) else str(raw)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "..."


def dead_letter_event(message: Any, destinations: Sequence[str] = ()) -> dict[str, Any] | None:
    """The trigger's apply function: a dead letter as a small JSON object (the asset event's payload).

    Reads the record's ``retry.*`` headers (the first of each, any bytes decoded with replacement and
    cut to ``MAX_TEXT`` characters), never its value. ``None`` (no event) for a tombstone, or for a
    dead letter whose destination matches none of ``destinations`` (globs such as ``"payments*"``)
    when some are given.
    """
    if message.value() is None:
        return None
    headers: dict[str, str | None] = {}
    for name, value in message.headers() or ():
        key = _FIELDS.get(name) if isinstance(name, str) else None
        if key is not None and key not in headers:
            headers[key] = _text(value)
    destination = headers.get("destination") or headers.get("original_topic")
    if destinations and not any(fnmatch.fnmatchcase(destination or "", glob) for glob in destinations):
        return None
    _kind, timestamp = message.timestamp()
    return {
        "dlq_topic": message.topic(),
        "partition": message.partition(),
        "offset": message.offset(),
        "timestamp_ms": timestamp,
        "key": _text(message.key()),
        **{field: headers.get(field) for field in _FIELDS.values()},
        "destination": destination,
    }


def dead_letters_asset(
    topics: Sequence[str],
    *,
    name: str = ASSET_NAME,
    kafka_config_id: str = WATCH_CONN_ID,
    destinations: Sequence[str] = (),
    poll_interval: float = 5.0,
) -> Asset:
    """An Asset updated by each dead letter on ``topics`` (only those of ``destinations``, globs, when
    given), watched in the triggerer through the connection ``kafka_config_id``."""
    from airflow.providers.apache.kafka.triggers.await_message import AwaitMessageTrigger
    from airflow.sdk import Asset, AssetWatcher

    if not topics or isinstance(topics, str):
        raise ValueError("topics must be a list of DLQ topics, e.g. ['retry.dlq']")
    trigger = AwaitMessageTrigger(
        topics=list(topics),
        apply_function=f"{__name__}.dead_letter_event",
        apply_function_kwargs={"destinations": list(destinations)},
        kafka_config_id=kafka_config_id,
        poll_interval=poll_interval,
    )
    return Asset(name=name, watchers=[AssetWatcher(name=f"{name}_watcher", trigger=trigger)])
