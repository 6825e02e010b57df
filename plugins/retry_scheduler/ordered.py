"""The consumer helper's ordered mode: what to do with each keyed record so that each key's records are
handled in their original order, each once, across failures, duplicates, restarts and rebalances.
Needs only ``confluent-kafka``.

When a record of a free key fails, the helper opens a *chain* for the key (a new id) and sends the
record to retry as the chain's *head* (``retry.blocks``). Every later record of the key is *parked* in
the chain (``retry.hold``): sent, unfailed, to the retry topic, where the scheduler holds it. When the
head's retry comes back and is handled, a *release* (``retry.release``) lets the scheduler publish the
parked records one at a time in their original order; a parked record that fails becomes the chain's
new head (its retry withdraws the release at ingest), and the rest of the chain waits for it again. A
head that dies (on the DLQ) releases its chain as dead: ``after_dead`` says whether its records are
handled or dead-lettered; when nothing waits behind it, the scheduler's *notice* (``retry.notice:
head-dead``, on the group's redelivery topic) tells the helper, which frees the key (:meth:`OrderedKeys.notice`;
a notice is never handed to the handler). The scheduler's side: ``sql/queries.sql``, ``set_chain_states`` and
``advance_holds``; the protocol: ``docs/guide/header-protocol.md``, "Per-key ordering".

What the helper keeps per key (:class:`~retry_scheduler.holds.Hold`, in the holds topic) makes it the
judge of every record it gets: it handles a record only when it is the first of its key not handled
yet, and passes it back (parked again) otherwise. So the order holds whatever comes twice or late: a
record the publisher sent twice, one parked twice because the helper died between parking it and
writing the hold, one the scheduler let out before the head's retry withdrew its release. A record of a
chain the key no longer waits in, or a copy of a head already handled, is a duplicate: skipped (not
handed to the handler) and counted (``OrderedKeys.counts``).
"""

from __future__ import annotations

import bisect
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Message

from retry_scheduler.client import RetryClient, header_text
from retry_scheduler.core import protocol
from retry_scheduler.holds import Hold, HoldStore, Position

log = logging.getLogger(__name__)

#: ``after_dead``: what the ordered mode does with the records held behind a head that died.
RELEASE, DEAD_LETTER = "release", "dead-letter"
#: How long a finished chain is remembered (to know a late copy of one of its records for one).
FINISHED_KEEP_S = 3600.0

#: ``call(msg)``: call the application's handler; the exception it raised, None when it succeeded.
Call = Callable[[Message], "BaseException | None"]


def _text(headers: Any, wanted: str) -> str | None:
    """A chain's id, as the scheduler reads it (stripped; None when empty)."""
    return (header_text(headers, wanted) or "").strip() or None


def is_notice(msg: Message) -> bool:
    """Whether ``msg`` is a notice of the scheduler to ordered mode (``retry.notice: head-dead``, no
    value), not a record of the application: never handed to a handler."""
    headers: Any = msg.headers()
    return msg.value() is None and header_text(headers, protocol.NOTICE) == protocol.NOTICE_HEAD_DEAD


def _number(headers: Any, wanted: str) -> int | None:
    """A whole number, exactly as the client carries it into a retry (else None)."""
    text = header_text(headers, wanted)
    return int(text) if text is not None and text.isascii() and text.isdigit() else None


@dataclass(frozen=True)
class Seen:
    """What ordered mode reads of a record: its chain (``retry.hold``), the chain it heads
    (``retry.blocks``), its ``retry.id`` and ``retry.attempt``, the head whose death released its chain
    (``retry.chain-state: dead:<retry.id>``), and its place in its key's order."""

    chain: str | None
    heads: str | None
    retry_id: str | None
    attempt: int
    dead_head: str | None
    position: Position

    @classmethod
    def of(cls, msg: Message) -> Seen:
        headers: Any = msg.headers()  # a list of (name, bytes | None) from the consumer
        state = _text(headers, protocol.CHAIN_STATE) or ""
        kind, _, head = state.partition(":")
        partition = _number(headers, protocol.ORIGINAL_PARTITION)
        offset = _number(headers, protocol.ORIGINAL_OFFSET)
        # As the client carries them into the retry, and so as the scheduler orders the chain.
        position = (
            partition if partition is not None else int(msg.partition() or 0),
            offset if offset is not None else int(msg.offset() or 0),
        )
        return cls(
            _text(headers, protocol.HOLD),
            _text(headers, protocol.BLOCKS),
            header_text(headers, protocol.ID),
            _number(headers, protocol.ATTEMPT) or 0,
            head or None if kind == protocol.CHAIN_DEAD else None,
            position,
        )


class OrderedKeys:
    """The held keys of one consumer (by original topic and key) and what each record does to them.

    Crash-safe by the order of its writes: a failed record's hold (its new head) is written before its
    retry is sent, so that the record, read again after a crash, is known as the head; a park, a
    release and a dead letter are sent before the hold that records them, so that a crash between
    sends them again (the scheduler and the places parked absorb the copy) rather than never.
    """

    def __init__(
        self,
        store: HoldStore,
        retries: RetryClient,
        call: Call,
        after_dead: str = RELEASE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if after_dead not in (RELEASE, DEAD_LETTER):
            raise ValueError(f"after_dead must be {RELEASE!r} or {DEAD_LETTER!r}, not {after_dead!r}")
        self.store = store
        self.retries = retries
        self.call = call
        self.after_dead = after_dead
        self.clock = clock
        #: The holds of the group's keys, as read from the holds topic and kept since.
        self.holds: dict[tuple[str, bytes], Hold] = {}
        #: ``duplicates`` skipped, records ``reparked`` (their turn had not come), records of an
        #: ``unknown_chain`` (one the helper holds nothing for: handled), ``dead_heads`` learnt of,
        #: ``stale_notices`` (of a head the key no longer waits for: read again, or late).
        self.counts = {
            "duplicates": 0,
            "reparked": 0,
            "unknown_chain": 0,
            "dead_heads": 0,
            "stale_notices": 0,
        }

    def held(self) -> dict[tuple[str, bytes], Hold]:
        """The keys held now (a head pending or records parked), without the finished chains."""
        return {where: hold for where, hold in self.holds.items() if not hold.finished}

    def process(self, msg: Message, where: tuple[str, bytes]) -> bool | None:
        """Handle, park or skip ``msg`` (a record of key ``where``). Whether the handler succeeded; None
        when it was not called (parked, passed back, skipped as a duplicate, dead-lettered)."""
        seen = Seen.of(msg)
        hold = self.holds.get(where)
        if hold is not None and hold.finished:
            if hold.chain in (seen.chain, seen.heads):
                return self._duplicate(msg, f"its key's chain {hold.chain} is finished")
            if (seen.chain is not None or seen.heads is not None) and not hold.legacy:
                # A chain opens only once the key's last one finished, every record parked in it
                # handled: a record of another chain than the last is a copy of an older one's (the
                # publisher sent it twice, a member parked it twice), handled already.
                return self._duplicate(
                    msg, f"its chain {seen.chain or seen.heads} is older than its key's last ({hold.chain})"
                )
            hold = None
        if hold is None:
            return self._free(msg, seen, where)
        if hold.head is not None and (
            # the head's retry
            (seen.heads == hold.chain and seen.retry_id == hold.head)
            # the head's own record read again (not committed when the helper stopped)
            or (
                seen.heads is None
                and seen.chain in (None, hold.chain)
                and seen.position == hold.head_position
            )
            # a 0.4.0 hold's head (its retry came back without retry.blocks)
            or (hold.head_attempt is None and seen.chain is None and seen.retry_id == hold.head)
        ):
            # The head's hold is written before its retry is sent: the record that failed into it
            # (one attempt before) may come again, its retry maybe never sent; handling any copy of
            # the pending head keeps the order (it is the key's first record not handled yet).
            if hold.head_attempt is not None and seen.attempt < hold.head_attempt - 1:
                return self._duplicate(msg, f"a copy of an earlier attempt of chain {hold.chain}'s head")
            return self._head(msg, seen, where, hold)
        if seen.heads is not None:
            return self._duplicate(msg, f"a copy of a retry of chain {seen.heads} handled already")
        if seen.chain == hold.chain:
            return self._member(msg, seen, where, hold)
        if seen.chain is not None and not hold.legacy:
            return self._duplicate(msg, f"its chain {seen.chain} is not its key's ({hold.chain})")
        return self._park(msg, seen, where, hold)

    def notice(self, msg: Message, where: tuple[str, bytes]) -> None:
        """The scheduler's notice (:func:`is_notice`) that the head of key ``where``'s chain died: as a
        record released behind the dead head would tell, and the key is free when nothing is parked
        (``after_dead`` applies to what is). A notice of another chain or head than the key waits for
        changes nothing (a copy read again after a crash, or one older than the key's chain)."""
        seen = Seen.of(msg)
        hold = self.holds.get(where)
        if (
            hold is None
            or hold.finished
            or hold.head is None
            or seen.chain != hold.chain
            or seen.dead_head not in (hold.head, protocol.CHAIN_ANY_HEAD)
        ):
            self.counts["stale_notices"] += 1
            log.info(
                "notice %s[%s]@%s (head %s of chain %s dead) changes nothing: the key waits for %s",
                msg.topic(), msg.partition(), msg.offset(), seen.dead_head, seen.chain,
                "nothing" if hold is None or hold.finished or hold.head is None else f"head {hold.head} of chain {hold.chain}",
            )  # fmt: skip
            return
        self._head_died(hold)
        self._settle(where, hold)

    def sweep(self, owned: Callable[[str, int], bool]) -> int:
        """Forget the finished chains older than :data:`FINISHED_KEEP_S` of the keys ``owned`` (original
        topic, partition) says this member reads; how many. Another member's keys are its own to forget."""
        now, forgotten = self.clock(), 0
        for where, hold in list(self.holds.items()):
            if hold.finished and now - hold.finished_at > FINISHED_KEEP_S and owned(where[0], hold.partition):
                self.store.put(where[0], where[1], None)
                del self.holds[where]
                forgotten += 1
        return forgotten

    # -- the cases -------------------------------------------------------------------------------------

    def _free(self, msg: Message, seen: Seen, where: tuple[str, bytes]) -> bool:
        """A record of a free key: handled; when it fails, it heads a new chain for the key."""
        if seen.chain is not None or seen.heads is not None:
            self.counts["unknown_chain"] += 1
            log.warning(
                "record %s[%s]@%s is of chain %s, which this group holds nothing for (finished over %.0f "
                "minutes ago, or the holds topic lost it): handled as a new record",
                msg.topic(), msg.partition(), msg.offset(), seen.chain or seen.heads, FINISHED_KEEP_S / 60,
            )  # fmt: skip
        error = self.call(msg)
        if error is None:
            return True
        hold = Hold(str(uuid.uuid4()), partition=seen.position[0])
        self._failed(msg, seen, where, hold, error)
        return False

    def _head(self, msg: Message, seen: Seen, where: tuple[str, bytes], hold: Hold) -> bool:
        """The chain's head, back (or read again): handled; what waits behind it goes on if it succeeds."""
        error = self.call(msg)
        if error is not None:
            self._failed(msg, seen, where, hold, error)
            return False
        # Released even when nothing is parked: a copy parked twice (the helper died between a park
        # and its hold) may still wait in the chain, and goes out, to be skipped, only when released.
        # Before the hold: a crash between sends it again. (The scheduler keeps no state for a chain
        # released with nothing held.)
        self.retries.release(msg, hold.chain)
        if hold.parked or hold.legacy:
            hold.head = hold.head_attempt = hold.head_position = hold.dead = None
        else:
            self._finish(hold)
        self._put(where, hold)
        return True

    def _member(self, msg: Message, seen: Seen, where: tuple[str, bytes], hold: Hold) -> bool | None:
        """A record of the key's chain, published by the scheduler: handled if its turn has come."""
        if hold.head is not None and seen.dead_head in (hold.head, protocol.CHAIN_ANY_HEAD):
            self._head_died(hold)
            self._put(where, hold)
        position = seen.position
        known = position in hold.parked
        if not known and not hold.legacy:
            return self._duplicate(msg, f"record {position} of chain {hold.chain} was handled already")
        if hold.head is not None or (known and position != hold.parked[0]):
            # Its turn has not come (the head is pending, or an earlier record of the key is still on
            # its way back): parked again, it comes back after them.
            self.retries.retry(msg, hold=hold.chain, chain_flows=hold.head is None)
            self.counts["reparked"] += 1
            return None
        if known:
            hold.parked.remove(position)
        else:
            hold.legacy -= 1
        if hold.dead is not None and self.after_dead == DEAD_LETTER:
            self.retries.dead_letter(msg, reason=f"held behind retry {hold.dead}, which is dead")
            self._settle(where, hold)
            return None
        error = self.call(msg)
        if error is not None:
            self._failed(msg, seen, where, hold, error)
            return False
        self._settle(where, hold)
        return True

    def _park(self, msg: Message, seen: Seen, where: tuple[str, bytes], hold: Hold) -> bool | None:
        """A record of a held key that is not in its chain yet: parked in it."""
        if seen.chain is None and seen.position in hold.parked:
            return None  # parked already (read again after a restart)
        self.retries.retry(msg, hold=hold.chain, chain_flows=hold.head is None)
        if seen.chain is None:  # (a 0.4.0 chain's record, passed on to the key's chain, is counted)
            bisect.insort(hold.parked, seen.position)
            self._put(where, hold)
        return None

    def _failed(
        self, msg: Message, seen: Seen, where: tuple[str, bytes], hold: Hold, error: BaseException
    ) -> None:
        """``msg`` failed: it heads the key's chain ``hold``. A retry: the hold first (the record read
        again after a crash is known as the head), then the retry. A fatal error: the dead letter first
        (a crash between sends it again rather than never), then the hold; the scheduler releases the
        chain as dead by its ``retry.blocks``."""
        retry_id = seen.retry_id or hold.head or str(uuid.uuid4())
        fatal = self.retries.is_fatal(error)
        log.info(
            "record %s[%s]@%s failed (%s): sent to %s, heading its key's chain %s",
            msg.topic(), msg.partition(), msg.offset(), error, "the DLQ" if fatal else "retry", hold.chain,
        )  # fmt: skip
        if fatal:
            self.retries.retry(msg, error, blocks=hold.chain, retry_id=retry_id)
            hold.head = hold.head_attempt = hold.head_position = None
            hold.dead = retry_id
            self._settle(where, hold)
            return
        hold.head, hold.head_attempt, hold.head_position = retry_id, seen.attempt + 1, seen.position
        hold.dead = None
        self._put(where, hold)
        self.retries.retry(msg, error, blocks=hold.chain, retry_id=retry_id)

    def _head_died(self, hold: Hold) -> None:
        """The head ``hold`` waits for is dead: the chain flows, ``after_dead`` deciding its records."""
        self.counts["dead_heads"] += 1
        log.warning(
            "retry %s of a held key is dead: the records held behind it are %s in order (%s of them)",
            hold.head, "handled" if self.after_dead == RELEASE else "dead-lettered", len(hold.parked) + hold.legacy,
        )  # fmt: skip
        hold.dead, hold.head, hold.head_attempt, hold.head_position = hold.head, None, None, None

    def _settle(self, where: tuple[str, bytes], hold: Hold) -> None:
        """Write ``hold`` after a record of its chain was done with: finished when nothing is left."""
        if hold.head is None and not hold.parked and not hold.legacy:
            self._finish(hold)
        self._put(where, hold)

    def _duplicate(self, msg: Message, why: str) -> bool | None:
        self.counts["duplicates"] += 1
        log.info("record %s[%s]@%s skipped, a duplicate: %s", msg.topic(), msg.partition(), msg.offset(), why)
        return None

    def _finish(self, hold: Hold) -> None:
        hold.head = hold.head_attempt = hold.head_position = hold.dead = None
        hold.parked, hold.legacy, hold.finished_at = [], 0, self.clock()

    def _put(self, where: tuple[str, bytes], hold: Hold) -> None:
        self.holds[where] = hold
        self.store.put(where[0], where[1], hold.copy())
