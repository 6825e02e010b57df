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
handled or dead-lettered. The scheduler's side: ``sql/queries.sql``, ``set_chain_states`` and
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

from retry_scheduler.client import RetryClient
from retry_scheduler.core import protocol
from retry_scheduler.holds import Hold, HoldStore, Position

log = logging.getLogger(__name__)

#: ``after_dead``: what the ordered mode does with the records held behind a head that died.
RELEASE, DEAD_LETTER = "release", "dead-letter"
#: How long a finished chain is remembered (to know a late copy of one of its records for one).
FINISHED_KEEP_S = 3600.0

#: ``handle(msg, chain)``: call the application's handler; on failure send the record to retry as the
#: head of ``chain``. Whether it succeeded, and the ``retry.id`` of its retry (None: handled, or dead).
Handle = Callable[[Message, str], tuple[bool, "str | None"]]


def _text(headers: Any, wanted: str) -> str | None:
    found = None
    for name, value in headers or ():
        if name == wanted and isinstance(value, bytes):
            found = value
    if found is None:
        return None
    try:
        return found.decode("utf-8").strip() or None
    except UnicodeDecodeError:
        return None


def _number(text: str | None) -> int | None:
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
        headers = msg.headers()
        state = _text(headers, protocol.CHAIN_STATE) or ""
        kind, _, head = state.partition(":")
        partition = _number(_text(headers, protocol.ORIGINAL_PARTITION))
        offset = _number(_text(headers, protocol.ORIGINAL_OFFSET))
        # As the client carries them into the retry, and so as the scheduler orders the chain.
        position = (
            partition if partition is not None else int(msg.partition() or 0),
            offset if offset is not None else int(msg.offset() or 0),
        )
        return cls(
            _text(headers, protocol.HOLD),
            _text(headers, protocol.BLOCKS),
            _text(headers, protocol.ID),
            _number(_text(headers, protocol.ATTEMPT)) or 0,
            head or None if kind == protocol.CHAIN_DEAD else None,
            position,
        )


class OrderedKeys:
    """The held keys of one consumer (by original topic and key) and what each record does to them."""

    def __init__(
        self,
        store: HoldStore,
        retries: RetryClient,
        handle: Handle,
        after_dead: str = RELEASE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if after_dead not in (RELEASE, DEAD_LETTER):
            raise ValueError(f"after_dead must be {RELEASE!r} or {DEAD_LETTER!r}, not {after_dead!r}")
        self.store = store
        self.retries = retries
        self.handle = handle
        self.after_dead = after_dead
        self.clock = clock
        #: The holds of the group's keys, as read from the holds topic and kept since.
        self.holds: dict[tuple[str, bytes], Hold] = {}
        #: ``duplicates`` skipped, records ``reparked`` (their turn had not come), records of an
        #: ``unknown_chain`` (one the helper holds nothing for: handled), ``dead_heads`` learnt of.
        self.counts = {"duplicates": 0, "reparked": 0, "unknown_chain": 0, "dead_heads": 0}

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
            hold = None
        if hold is None:
            return self._free(msg, seen, where)
        before = hold.copy()
        if seen.heads is not None or (
            hold.head_attempt is None
            and hold.head is not None
            and seen.chain is None
            and seen.retry_id == hold.head
        ):  # a head's retry (0.4.0's came back without retry.blocks)
            ok = self._head(msg, seen, hold)
        elif seen.chain == hold.chain:
            ok = self._member(msg, seen, hold)
        elif seen.chain is not None and not hold.legacy:
            ok = self._duplicate(msg, f"its chain {seen.chain} is not its key's ({hold.chain})")
        else:
            ok = self._park(msg, seen, hold)
        if hold != before:
            self._put(where, hold)
        return ok

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
        """A record of a free key: handled; when it fails, its retry heads a new chain for the key."""
        if seen.chain is not None or seen.heads is not None:
            self.counts["unknown_chain"] += 1
            log.warning(
                "record %s[%s]@%s is of chain %s, which this group holds nothing for (finished over %.0f "
                "minutes ago, or the holds topic lost it): handled as a new record",
                msg.topic(), msg.partition(), msg.offset(), seen.chain or seen.heads, FINISHED_KEEP_S / 60,
            )  # fmt: skip
        chain = str(uuid.uuid4())
        ok, retry_id = self.handle(msg, chain)
        if retry_id is not None:
            self._put(where, Hold(chain, retry_id, seen.attempt + 1, partition=seen.position[0]))
        return ok

    def _head(self, msg: Message, seen: Seen, hold: Hold) -> bool | None:
        """The retry of a chain's head: handled if it is the one the chain waits on, else a duplicate."""
        if (
            hold.head is None
            or seen.retry_id != hold.head
            or seen.heads not in (None, hold.chain)
            or (hold.head_attempt is not None and seen.attempt != hold.head_attempt)
        ):
            return self._duplicate(
                msg, f"a copy of a retry of chain {seen.heads or hold.chain} handled already"
            )
        ok, retry_id = self.handle(msg, hold.chain)
        if retry_id is not None:  # failed again: the chain goes on waiting for its next attempt
            hold.head_attempt = seen.attempt + 1
            return ok
        hold.head = hold.head_attempt = None
        hold.dead = None if ok else seen.retry_id
        if not (hold.parked or hold.legacy):
            self._finish(hold)
        elif ok:  # what waits behind it may go (a dead one's chain the scheduler releases by itself)
            self.retries.release(msg, hold.chain)
        return ok

    def _member(self, msg: Message, seen: Seen, hold: Hold) -> bool | None:
        """A record of the key's chain, published by the scheduler: handled if its turn has come."""
        if seen.dead_head is not None and seen.dead_head == hold.head:
            self.counts["dead_heads"] += 1
            log.warning(
                "retry %s of a held key is dead: the records held behind it are %s in order",
                hold.head, "handled" if self.after_dead == RELEASE else "dead-lettered",
            )  # fmt: skip
            hold.dead, hold.head, hold.head_attempt = hold.head, None, None
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
        ok: bool | None
        if hold.dead is not None and self.after_dead == DEAD_LETTER:
            self.retries.dead_letter(msg, reason=f"held behind retry {hold.dead}, which is dead")
            ok = None
        else:
            ok, retry_id = self.handle(msg, hold.chain)
            if retry_id is not None:  # the chain's new head: the rest waits for it
                hold.head, hold.head_attempt, hold.dead = retry_id, seen.attempt + 1, None
        if hold.head is None and not hold.parked and not hold.legacy:
            self._finish(hold)
        return ok

    def _park(self, msg: Message, seen: Seen, hold: Hold) -> bool | None:
        """A record of a held key that is not in its chain yet: parked in it."""
        if seen.chain is None and seen.position in hold.parked:
            return None  # parked already (read again after a restart)
        self.retries.retry(msg, hold=hold.chain, chain_flows=hold.head is None)
        if seen.chain is None:  # (a 0.4.0 chain's record, passed on to the key's chain, is counted)
            bisect.insort(hold.parked, seen.position)
        return None

    def _duplicate(self, msg: Message, why: str) -> bool | None:
        self.counts["duplicates"] += 1
        log.info("record %s[%s]@%s skipped, a duplicate: %s", msg.topic(), msg.partition(), msg.offset(), why)
        return None

    def _finish(self, hold: Hold) -> None:
        hold.head = hold.head_attempt = hold.dead = None
        hold.parked, hold.legacy, hold.finished_at = [], 0, self.clock()

    def _put(self, where: tuple[str, bytes], hold: Hold) -> None:
        self.holds[where] = hold
        self.store.put(where[0], where[1], hold)
