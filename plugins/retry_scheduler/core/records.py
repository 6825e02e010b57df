"""From a consumed record to a ``retry_jobs`` row: the header protocol and the policy applied.

:class:`RowBuilder` is the ingest loop's hot path and never raises: a record it cannot understand
becomes a dead (``invalid``) row whose reason names the fault.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import NamedTuple

from retry_scheduler.core import protocol
from retry_scheduler.core.adopt import AdoptError, adopt, retried
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.durations import format_duration_ms
from retry_scheduler.core.headers import (
    MAX_EPOCH_MS,
    MAX_INT32,
    MAX_RETRY_ID_CHARS,
    Header,
    InvalidRecordError,
    Limits,
    RetryHeaders,
    parse_headers,
    truncate_reason,
)
from retry_scheduler.core.jobs import (
    HELD_DUE,
    CopyRow,
    Status,
    decode_headers,
    encode_headers,
    ms_of_pg_time,
    pg_time,
    replays_of,
)
from retry_scheduler.core.policy import Policy, UnknownPolicyError

#: A chain event (:attr:`RowBuilder.chain_events`): its head's retry is pending, so the chain waits.
CHAIN_BLOCKED = "blocked"
ChainEvent = tuple[str, str, str | None]


def _raw_text(headers: Sequence[Header], wanted: str) -> str | None:
    """The last ``wanted`` header as text of 1 to 200 characters; None when absent or not such text."""
    found = None
    for name, value in headers:
        if name == wanted:
            found = value
    if not found:
        return None
    try:
        text = found.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if len(text.strip()) > 0 and len(text) <= MAX_RETRY_ID_CHARS and "\x00" not in text else None


def _raw_retry_id(headers: Sequence[Header]) -> str | None:
    return _raw_text(headers, protocol.ID)


def _raw_int(headers: Sequence[Header], wanted: str, high: int) -> int | None:
    """The last ``wanted`` header as a whole number from 0 to ``high``; None when absent or not one."""
    text = _raw_text(headers, wanted)
    if text is None or not text.strip().isdigit():
        return None
    number = int(text.strip())
    return number if number <= high else None


def carried_attempt(headers: Sequence[Header]) -> int:
    """The retries a record already carries (its last ``retry.attempt``; 0 without a valid one).

    A record this service published carries it, and a tool that copies the failed record's headers into
    its dead letter (Kafka Streams) or points at it (a share group's letter) hands it back: a letter
    adopted ``:retry`` goes on counting from there, so that its policy ends it rather than start over."""
    return _raw_int(headers, protocol.ATTEMPT, MAX_INT32) or 0


def record_retry_id(topic: str, partition: int, offset: int, timestamp_ms: int | None) -> str:
    """The ``retry.id`` of a record read from a retry topic without one: a UUID (version 8) named by
    where the record was read, so that the record read again (after a failover lost the row of it,
    or from a topic read once more) gets the same id, and a second publication of it is told as a
    duplicate by that id."""
    name = f"{topic}\x00{partition}\x00{offset}\x00{timestamp_ms}".encode("utf-8", "surrogateescape")
    h = hashlib.blake2b(name, digest_size=16).hexdigest()
    return f"{h[:8]}-{h[8:12]}-8{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:32]}"


def new_retry_id() -> str:
    """A random (version 4) UUID as text, for a record that carries no ``retry.id``.

    Made 1 024 at a time from one read of the system's random source: the ingest loop needs one for
    most records, and with a read (a system call) per id, making ids was a tenth of the loop's samples.
    """
    try:
        return _ids.pop()
    except IndexError:
        h = os.urandom(16 * _ID_BATCH).hex()
        _ids.extend(
            f"{h[i : i + 8]}-{h[i + 8 : i + 12]}-4{h[i + 13 : i + 16]}-{_VARIANT[h[i + 16]]}{h[i + 17 : i + 20]}-{h[i + 20 : i + 32]}"
            for i in range(0, len(h), 32)
        )
        return _ids.pop()


_VARIANT = {c: "89ab"[int(c, 16) % 4] for c in "0123456789abcdef"}
_ID_BATCH = 1024
_ids: list[str] = []
# A forked child must not hand out the ids its parent may hand out too.
os.register_at_fork(after_in_child=_ids.clear)


class Consumed(NamedTuple):
    """A record as it was read: where from, its timestamp (None: none), key, value and headers."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    headers: Sequence[Header] | None


class RowBuilder:
    """Turns consumed records into ``retry_jobs`` rows (``jobs.COPY_COLUMNS``): pending with a due
    time, or dead with a reason. It never raises: a record it cannot understand, or that fails in
    any other way, becomes a dead (``invalid``) row whose reason names the fault, with its key, value
    and headers kept as they came.

    Times are checked against a window (:data:`MIN_TRUSTED_MS`, ``now`` plus the allowed skew): a
    record timestamp outside it is not trusted and the ingest time counts instead (the row keeps
    the record's own timestamp in ``source_timestamp_ms``; :attr:`untrusted_timestamps` counts
    them); a ``retry.original-timestamp`` in the future beyond the skew, or a ``retry.at`` further
    ahead than ``max_retry_ahead_ms``, makes the record invalid. No job waits for centuries.

    The ingest loop's hot path: it builds the :class:`~retry_scheduler.core.jobs.CopyRow` that COPY
    sends, with no object in between.
    """

    def __init__(self, deployment: Deployment, limits: Limits | None = None) -> None:
        """``limits``: what a record may hold and where it may go (default: the deployment's)."""
        settings = deployment.settings
        self.registry = registry = deployment.policies
        self.limits = limits or deployment.limits
        self.max_record_bytes = settings.max_record_bytes
        self.delay_topics = settings.delay_topics
        self.adopt_topics = settings.adopt_topics
        self.max_skew_ms = settings.max_clock_skew_ms
        self.max_ahead_ms = settings.max_retry_ahead_ms
        self.park_after = settings.park_after_replays
        self.default = registry.resolve(None, None)
        #: Records so far whose timestamp was outside the trusted window (their ingest time was used).
        self.untrusted_timestamps = 0
        #: Ordered mode: what the records read so far say of their chains, in their order (taken by
        #: :meth:`take_chain_events`): ``(chain, CHAIN_RELEASED | CHAIN_BLOCKED | CHAIN_DEAD, the
        #: retry.id of the head it waits for or that died; None when released)``.
        self.chain_events: list[ChainEvent] = []
        #: Ordered mode: the notices of heads that died in the records read so far (taken by
        #: :meth:`take_notices`; see :func:`notice_of`).
        self.notices: list[CopyRow] = []

    def take_chain_events(self) -> list[ChainEvent]:
        """The chain events of the records built since the last call, in their order."""
        events, self.chain_events = self.chain_events, []
        return events

    def take_notices(self) -> list[CopyRow]:
        """The notice rows of the heads that died in the records built since the last call."""
        notices, self.notices = self.notices, []
        return notices

    def row(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp_ms: int | None,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header] | None,
        now_ms: int,
    ) -> CopyRow | None:
        """The row of one consumed record; never raises. None for a release record (``retry.release``):
        it stores no job, its blocker is added to :attr:`releases` for the batch's transaction."""
        if self.adopt_topics and topic in self.adopt_topics:
            return self.adopted(Consumed(topic, partition, offset, timestamp_ms, key, value, headers), now_ms)
        try:
            parsed = parse_headers(
                headers,
                self.limits,
                record_bytes=len(key or b"") + len(value or b""),
                max_record_bytes=self.max_record_bytes,
            )
            try:
                policy = self.registry.resolve(parsed.policy, parsed.scoped_from or parsed.destination)
            except UnknownPolicyError as exc:
                raise InvalidRecordError(str(exc)) from None
            if (parsed.at_ms is not None and parsed.at_ms > now_ms + self.max_ahead_ms) or (
                parsed.original_timestamp_ms is not None
                and parsed.original_timestamp_ms > now_ms + self.max_skew_ms
            ):
                raise InvalidRecordError(self._time_refusal(parsed, now_ms))
            if parsed.release is not None:
                self.chain_events.append((parsed.release, protocol.CHAIN_RELEASED, None))
                return None
            seen_ms = self._seen_ms(timestamp_ms, now_ms)
            retry_id = parsed.retry_id or record_retry_id(topic, partition, offset, timestamp_ms)
            first_seen = parsed.original_timestamp_ms or seen_ms
            reason = parsed.reason
            if parsed.hold is not None:
                # Parked behind an earlier record of its key (ordered mode): it did not fail, so no
                # policy decision; due when its chain is released (jobs.HELD_DUE until then).
                dead, due = None, HELD_DUE
                if parsed.chain_state is not None:  # parked while its chain flows: it goes in its turn
                    self.chain_events.append((parsed.hold, protocol.CHAIN_RELEASED, None))
            else:
                at_ms = parsed.at_ms
                if at_ms is None and topic in self.delay_topics:
                    at_ms = seen_ms + self.delay_topics[topic]
                decision = policy.decide(
                    attempt=parsed.attempt, first_seen_ms=first_seen, base_ms=seen_ms, now_ms=now_ms,
                    retry_id=retry_id, error_class=parsed.error_class, at_ms=at_ms, send_to_dlq=parsed.send_to_dlq,
                )  # fmt: skip
                dead, due = decision.dead_reason, pg_time(decision.due_ms)
                if dead and self.park_after:
                    dead, reason = self._parked(parsed, dead, reason)
            # Positional (the hot path, a third faster than keywords), in CopyRow's field order.
            row = CopyRow(
                topic, partition, offset, timestamp_ms or 0, parsed.destination, parsed.destination_partition, key,
                value, encode_headers(parsed.passthrough), parsed.attempt, policy.name, reason,
                parsed.error_class, parsed.group, retry_id,
                # A record that names no origin came from its destination.
                parsed.original_topic or parsed.destination, parsed.original_partition, parsed.original_offset,
                pg_time(first_seen), due, _DEAD if dead else _PENDING, dead, policy.dlq_topic, due if dead else None,
                parsed.hold,
            )  # fmt: skip
            if parsed.blocks is not None and parsed.hold is None:
                self._chain_head(row, parsed.blocks, parsed)
            return row
        except InvalidRecordError as exc:
            reason = str(exc)
        except Exception as exc:  # a fault of ours must not halt ingestion: keep the record, dead
            reason = f"the record could not be turned into a job ({type(exc).__name__}: {exc})"
        return self.invalid(
            Consumed(topic, partition, offset, timestamp_ms, key, value, headers), now_ms, reason
        )

    def _chain_head(self, row: CopyRow, chain: str, parsed: RetryHeaders) -> None:
        """Ordered mode, the retry of a chain's head (``retry.blocks``): its chain waits while it is
        pending, or goes on if it is dead, with a notice to the consumer helper (:func:`notice_of`)
        unless the consumer sent it to the DLQ itself (``retry.send-to: dlq``): it knows."""
        dead = row.dead_reason
        self.chain_events.append((chain, protocol.CHAIN_DEAD if dead else CHAIN_BLOCKED, row.retry_id))
        if dead and parsed.scoped_from is not None and not parsed.send_to_dlq:
            self.notices.append(notice_of(row, chain, dead))

    def _time_refusal(self, parsed: RetryHeaders, now_ms: int) -> str:
        """Why a record's time headers are refused: a ``retry.at`` too far ahead, or a
        ``retry.original-timestamp`` in the future beyond the allowed skew."""
        if parsed.at_ms is not None and parsed.at_ms > now_ms + self.max_ahead_ms:
            return (
                f"header {protocol.AT}={parsed.at_ms} is more than {format_duration_ms(self.max_ahead_ms)} "
                "ahead (RETRY_MAX_RETRY_AHEAD_MS); it must be in epoch milliseconds"
            )
        return (
            f"header {protocol.ORIGINAL_TIMESTAMP}={parsed.original_timestamp_ms} is more than "
            f"{format_duration_ms(self.max_skew_ms)} in the future (RETRY_MAX_CLOCK_SKEW_MS); it must be "
            "in epoch milliseconds"
        )

    def _parked(self, parsed: RetryHeaders, dead: str, reason: str | None) -> tuple[str, str | None]:
        """A dead record's (dead reason, reason): parked when it was replayed ``park_after`` times and
        died again (``RETRY_PARK_AFTER_REPLAYS``), else as it was."""
        replays = replays_of(parsed.passthrough)
        if replays < self.park_after:
            return dead, reason
        why = f"parked after {replays} replays, then {dead}: {reason or 'no reason given'}"
        return protocol.DEAD_PARKED, truncate_reason(why, self.limits.max_reason_chars)

    def adopted(self, record: Consumed, now_ms: int) -> CopyRow:
        """The dead (``adopted``) row of a record of another tool's dead-letter topic
        (:mod:`retry_scheduler.core.adopt`): its original topic is the destination, its exception the
        error class and reason; kept byte for byte. One that names no valid original topic is invalid.
        From a topic adopted with ``:retry``, a pending row instead, scheduled by the destination's
        policy (its attempt: the ``retry.attempt`` the record carries, plus a share group's deliveries
        less one), or dead as that policy says."""
        topic, partition, offset, timestamp_ms, key, value, headers = record
        try:
            spec = self.adopt_topics[topic]
            found = adopt(spec, headers or (), self.limits.max_reason_chars)
            policy = self.registry.resolve(None, found.original_topic)
            first_seen = self._carried_first_seen(headers or (), now_ms) or found.original_timestamp_ms
            if first_seen is None or not MIN_TRUSTED_MS <= first_seen <= now_ms + self.max_skew_ms:
                first_seen = self._seen_ms(timestamp_ms, now_ms)
            # Retries already made: those the record carries (a tool that copies the failed record's
            # headers hands back ours), and a share group's deliveries less the first.
            deliveries = max((found.delivery_count or 1) - 1, 0)
            now, attempt = pg_time(now_ms), min(carried_attempt(headers or ()) + deliveries, MAX_INT32)
            # A letter of a record we published carries its retry.id; the first letter of a failure is named
            # by the record it points at, so a tool's duplicate letters share one.
            retry_id = _raw_retry_id(headers or ()) or found.failure_id(topic) or new_retry_id()
            dead: str | None = protocol.DEAD_ADOPTED
            due, why = now, found.reason
            if retried(spec):
                refusal = self.limits.destinations.refusal(found.original_topic)
                if refusal is None:
                    dead, due = _retry_decision(
                        policy, attempt, first_seen, now_ms, retry_id, found.error_class
                    )
                else:  # kept, dead, as without :retry; a replay is refused the same way
                    why = truncate_reason(
                        f"{found.reason or 'no reason given'}; not retried: {refusal}",
                        self.limits.max_reason_chars,
                    )
            return CopyRow(
                topic, partition, offset, _int8(timestamp_ms), found.original_topic, found.original_partition,
                key, value, encode_headers(headers or ()), attempt, policy.name,
                why, found.error_class, found.group, retry_id,
                found.original_topic, found.original_partition, found.original_offset, pg_time(first_seen), due,
                _DEAD if dead else _PENDING, dead, topic, due if dead else None,
            )  # fmt: skip
        except AdoptError as exc:
            reason = str(exc)
        except Exception as exc:  # a fault of ours must not halt ingestion: keep the record, dead
            reason = f"the dead letter could not be adopted ({type(exc).__name__}: {exc})"
        return self.invalid(record, now_ms, reason)

    def _carried_first_seen(self, headers: Sequence[Header], now_ms: int) -> int | None:
        """When a record that went through this service first failed (its ``retry.original-timestamp``),
        if it carries one that is trusted: a policy's maximum age counts from there."""
        carried = _raw_int(headers, protocol.ORIGINAL_TIMESTAMP, MAX_EPOCH_MS)
        return (
            carried
            if carried is not None and MIN_TRUSTED_MS <= carried <= now_ms + self.max_skew_ms
            else None
        )

    def recount(self, row: CopyRow, now_ms: int) -> CopyRow:
        """A share group's pointer-only letter from a ``:retry`` topic, completed from its source record
        (:mod:`retry_scheduler.loops.sources`): scheduled again now that the record's own headers are
        known. The retries it carries (``retry.attempt``, when this service published it) are added to
        the share group's deliveries, its ``retry.id`` and first failure are kept, and the destination's
        policy decides again: a record that always fails dies by its policy instead of starting over.
        Any other row is returned as it is."""
        spec = self.adopt_topics.get(row.source_topic)
        if spec is None or not retried(spec) or row.status != _PENDING or row.destination is None:
            return row
        headers = decode_headers(row.headers)
        carried, first_seen = carried_attempt(headers), self._carried_first_seen(headers, now_ms)
        if not carried and first_seen is None:
            return row
        attempt, retry_id = min(row.attempt + carried, MAX_INT32), _raw_retry_id(headers) or row.retry_id
        first_seen = first_seen or ms_of_pg_time(row.first_seen_at)
        policy = self.registry.resolve(None, row.destination)
        dead, due = _retry_decision(policy, attempt, first_seen, now_ms, retry_id, row.error_class)
        return row._replace(
            attempt=attempt, retry_id=retry_id, first_seen_at=pg_time(first_seen), due_at=due,
            status=_DEAD if dead else _PENDING, dead_reason=dead, dead_at=due if dead else None,
        )  # fmt: skip

    def invalid(self, record: Consumed, now_ms: int, reason: str) -> CopyRow:
        """A dead (``invalid``) row keeping the record as it came, with ``reason``; never raises."""
        topic, partition, offset, timestamp_ms, key, value, headers = record
        default, now = self.default, pg_time(now_ms)
        reason = reason.replace("\x00", "\\x00")  # an exception's text may quote the record
        try:
            encoded = encode_headers(headers or ())
        except Exception as exc:  # not str names and bytes values: keep what can be kept, say so
            encoded = b""
            reason = f"{reason}; its headers could not be kept ({type(exc).__name__}: {exc})"
        try:
            retry_id = _raw_retry_id(headers or ()) or new_retry_id()
        except Exception:
            retry_id = new_retry_id()
        try:
            blocks = _raw_text(headers or (), protocol.BLOCKS)
            blocks = None if blocks is None else blocks.strip()
        except Exception:
            blocks = None
        if blocks is not None:  # the head of a chain, dead: its chain goes on rather than wait for ever
            self.chain_events.append((blocks, protocol.CHAIN_DEAD, retry_id))
        return CopyRow(
            source_topic=topic, source_partition=partition, source_offset=offset,
            source_timestamp_ms=_int8(timestamp_ms), destination=None, destination_partition=None,
            msg_key=key, msg_value=value, headers=encoded, attempt=0, policy=default.name,
            reason=truncate_reason(reason, self.limits.max_reason_chars), error_class=None,
            consumer_group=None, retry_id=retry_id, original_topic=None, original_partition=None,
            original_offset=None, first_seen_at=pg_time(self._seen_ms(timestamp_ms, now_ms)), due_at=now,
            status=Status.DEAD.value, dead_reason=protocol.DEAD_INVALID, dlq_topic=default.dlq_topic,
            dead_at=now,
        )  # fmt: skip

    def _seen_ms(self, timestamp_ms: int | None, now_ms: int) -> int:
        """The record's timestamp when it is trusted, else the ingest time."""
        if timestamp_ms is not None and MIN_TRUSTED_MS <= timestamp_ms <= now_ms + self.max_skew_ms:
            return timestamp_ms
        if timestamp_ms is not None:
            self.untrusted_timestamps += 1
        return now_ms


def _retry_decision(
    policy: Policy, attempt: int, first_seen_ms: int, now_ms: int, retry_id: str, error: str | None
) -> tuple[str | None, int]:
    """A letter retried (``:retry``) by its destination's ``policy``: (dead reason or None, due as a
    COPY time). The delay counts from when the letter is read: a tool's letter may carry the failed
    record's own timestamp (Streams, Spring), long before it failed. Dead by the policy (exhausted,
    fatal, expired), it stays where it is: on its dead-letter topic."""
    decision = policy.decide(
        attempt=attempt, first_seen_ms=first_seen_ms, base_ms=now_ms, now_ms=now_ms,
        retry_id=retry_id, error_class=error,
    )  # fmt: skip
    return decision.dead_reason, pg_time(decision.due_ms)


def notice_of(head: CopyRow, chain: str, dead_reason: str) -> CopyRow:
    """The notice row of ``head``, the retry of a chain's head that died as it was stored.

    The consumer helper learns that a head died from the chain's records the scheduler publishes with
    ``retry.chain-state: dead:<retry.id>``; a head with no record of its key parked behind it would
    leave the key held at the helper until the key's next record. So the chain gets one more held
    record, stored in the head's batch (at least once, like any job): no value, ``retry.notice:
    head-dead``, at the head's place in the key's order (first of the chain), going to the head's own
    redelivery topic and partition when the chain is released as dead, i.e. at once. The helper frees
    the key and hands the notice to no handler (``retry_scheduler.ordered``). Only for a group's
    redelivery topic (``retry.scope: group``): one that every group reads is no place for it; and not
    for a head the consumer sent to the DLQ itself (``retry.send-to: dlq``), which it knows is dead.

    Its source key is the head's record with the timestamp ``-1 - t``: read again, the head's record
    makes the same notice, which the unique source key stores once."""
    return head._replace(
        source_timestamp_ms=-1 - head.source_timestamp_ms,
        msg_value=None,
        headers=encode_headers([(protocol.NOTICE, protocol.NOTICE_HEAD_DEAD.encode())]),
        reason=f"notice to the consumer helper: retry {head.retry_id}, the head of chain {chain}, died ({dead_reason})",
        error_class=None,
        retry_id=new_retry_id(),
        due_at=HELD_DUE,
        status=_PENDING,
        dead_reason=None,
        dead_at=None,
        held_by=chain,
    )


#: Record timestamps before this (2000-01-01 UTC) are not trusted: seconds or a clock at zero.
MIN_TRUSTED_MS = 946_684_800_000
_INT8 = range(-(2**63), 2**63)


def _int8(value: int | None) -> int:
    """A value for a ``bigint`` column: 0 for none or one out of range (a Kafka timestamp never is)."""
    return value if value is not None and value in _INT8 else 0


_DEAD, _PENDING = Status.DEAD.value, Status.PENDING.value
