"""Publish: claim due jobs, produce them to their destination (dead ones to the DLQ), mark them.

A job is marked published only after the broker acknowledged it, in the transaction that locked it.
A crash between produce and mark ends that transaction: the job is due again at once and is
produced again with the same ``retry.id`` and ``retry.attempt`` (at-least-once).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from retry_scheduler.core import faults, protocol
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.jobs import OutgoingRow, chain_headed, destination_headers, dlq_headers
from retry_scheduler.core.metrics import SNAPSHOT_EVERY_S, Metrics, NoMetrics
from retry_scheduler.db.chains import expire_chains
from retry_scheduler.db.store import Store
from retry_scheduler.db.vacuum import SelfVacuum
from retry_scheduler.loops.claim_floors import ClaimFloors
from retry_scheduler.loops.counts import SLOW_ROUND_S, PublishCounts
from retry_scheduler.loops.gates import Gate, deployment_gates
from retry_scheduler.loops.handover import ALIVE_S, LoopTenure, new_worker_id
from retry_scheduler.loops.kafka import TopicManager, make_producer, wait_until_ready

log = logging.getLogger(__name__)

#: How long a starting publish loop waits for its producers' ids before it publishes regardless.
PRODUCER_READY_S = 15.0

#: How often the publish loop forgets released chains (ordered mode) that nothing waits in, and after
#: how long: a key's records parked while its chain flows say so themselves, so only a chain whose head
#: died needs its row, for the records its key may still send behind it (a consumer away longer finds
#: them held until its chain is released by hand).
FORGET_CHAINS_EVERY_S = 60.0
RELEASED_CHAIN_KEEP_S = 7 * 86_400.0
#: How much longer than the delivery timeout a round waits for its acknowledgements (at most half the
#: time from the delivery timeout to the lease).
FLUSH_MARGIN_S = 5.0
#: Delivery errors after which the producer's idempotence state is broken for good (seen when the broker
#: fenced its epoch bump after requests timed out in flight): only a new producer can publish again.
_BROKEN_PRODUCER = frozenset(
    {KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FATAL}
)


class Publisher(ClaimFloors):
    """Publishes due jobs and dead jobs; many publishers may run at once (SKIP LOCKED)."""

    def __init__(
        self,
        deployment: Deployment,
        store: Store,
        producer: Producer | None = None,
        topics: TopicManager | None = None,
        clock: Callable[[], float] = time.time,
        store_factory: Callable[[str], Store] = Store,
        metrics: Metrics | None = None,
        gates: Callable[[Store], Sequence[Gate]] | None = None,
    ) -> None:
        """``metrics``: where each round's counts, and every :data:`SNAPSHOT_EVERY_S` the backlog
        and lateness, are reported (by this publisher: its helpers report their rounds only).
        ``gates``: makes a publisher's gates on its store (:mod:`retry_scheduler.loops.gates`; by
        default the deployment's breakers and rate limits)."""
        self.deployment = deployment
        self.settings = settings = deployment.settings
        self.metrics: Metrics = metrics or NoMetrics()
        self._snapshot_at = 0.0
        # Checked again before every publish: a destination taken off the list after its jobs were
        # stored is not published to (the job goes dead, invalid, with the reason).
        self.destinations = deployment.destinations
        self.store = store
        self.make_gates = gates or (
            lambda on: deployment_gates(deployment, on, clock=clock, metrics=self.metrics)
        )
        self.gates: Sequence[Gate] = self.make_gates(store)
        self.store_factory = store_factory
        self.producer = producer or make_producer(settings)
        self.topics = topics or TopicManager(settings)
        self.clock = clock
        self.worker = new_worker_id("publish")
        # A publisher that hangs inside its transaction (not dead: its session stays) releases its
        # jobs after the lease time, as a dead one does at once.
        store.queue.limit_idle_transactions(settings.lease_ms)
        self.totals = PublishCounts()
        self.helpers: list[Publisher] = []
        self.error: Exception | None = None
        self._tenure: LoopTenure | None = None  # the loop's, while it runs (not a helper's)
        self._init_floors()
        self._chains_forgotten_at = float("-inf")  # monotonic: when it last forgot released chains
        #: Vacuums retry_jobs where the server does not (run by the loop's own publisher, not its helpers).
        self.vacuum = SelfVacuum(settings.database_url) if settings.self_vacuum else None

    def close(self) -> None:
        self.producer.flush(self.settings.delivery_timeout_ms / 1000)
        if self.vacuum is not None:
            self.vacuum.close()

    def _produce_all(
        self, rows: list[OutgoingRow], to_dlq: bool
    ) -> tuple[list[tuple[int, int]], list[tuple[int, str]], list[tuple[int, str]]]:
        """Produce and wait for the acks: the acknowledged, the failed (to retry) and the unroutable jobs."""
        acked: list[tuple[int, int]] = []
        failed: list[tuple[int, str]] = []
        unroutable: list[tuple[int, str]] = []
        broken: list[KafkaError] = []

        def delivered(job_id: int) -> Callable[[KafkaError | None, Message], None]:
            def callback(err: KafkaError | None, _msg: Message) -> None:
                if err is None:
                    acked.append((job_id, int(self.clock() * 1000)))
                else:
                    failed.append((job_id, f"delivery failed: {err.str()}"))
                    if err.fatal() or err.code() in _BROKEN_PRODUCER:
                        broken.append(err)

            return callback

        targets = {row.dlq_topic if to_dlq else row.destination for row in rows}
        refused: dict[str, str] = {}
        if not to_dlq:
            refused = {t: why for t in targets if t and (why := self.destinations.refusal(t)) is not None}
            targets -= set(refused)
        missing = set(self.topics.ensure((t for t in targets if t), create=self.settings.create_topics))
        for row in rows:
            topic = row.dlq_topic if to_dlq else row.destination
            if not topic:
                failed.append((row.id, "job has no destination"))
                continue
            if topic in refused:
                unroutable.append((row.id, refused[topic]))
                continue
            if topic in missing:
                failed.append(
                    (row.id, f"topic {topic} does not exist: create it, or set RETRY_CREATE_TOPICS=true")
                )
                continue
            kwargs: dict[str, Any] = {
                "key": row.key,
                "value": row.value,
                "headers": dlq_headers(row) if to_dlq else destination_headers(row),
                "on_delivery": delivered(row.id),
            }
            if not to_dlq and row.destination_partition is not None:
                kwargs["partition"] = row.destination_partition
            self._produce_one(row.id, topic, kwargs, failed, unroutable, broken)
            self.producer.poll(0)
        # librdkafka answers for each record within the delivery timeout; a little longer for its
        # callbacks, and always less than the lease: the round's transaction is idle meanwhile, and the
        # server ends a session idle in a transaction past the lease (limit_idle_transactions).
        delivery_s, lease_s = self.settings.delivery_timeout_ms / 1000, self.settings.lease_ms / 1000
        waited_s = delivery_s + min(FLUSH_MARGIN_S, (lease_s - delivery_s) / 2)
        if self.producer.flush(waited_s):
            # Not one word from the producer on these: retried after the backoff of a failed delivery
            # (released at once, they would be claimed again while the producer may still send them).
            answered = {job_id for job_id, _ in acked} | {job_id for job_id, _ in (*failed, *unroutable)}
            unanswered = [row.id for row in rows if row.id not in answered]
            failed += [(job_id, f"no acknowledgement within {waited_s:g} s") for job_id in unanswered]
            if unanswered:
                log.warning(
                    "%s records still unacknowledged after %g s: their jobs are retried after a backoff",
                    len(unanswered), waited_s,
                )  # fmt: skip
        if broken:
            log.warning("the producer cannot publish any more (%s): replacing it", broken[0].str())
            old, self.producer = self.producer, make_producer(self.settings)
            old.purge()
            old.flush(0)
        return acked, failed, unroutable

    def _produce_one(
        self,
        job_id: int,
        topic: str,
        kwargs: dict[str, Any],
        failed: list[tuple[int, str]],
        unroutable: list[tuple[int, str]],
        broken: list[KafkaError],
    ) -> None:
        """Hand one record to the producer (waiting while its local queue is full); a job it cannot take
        goes to ``failed`` (to retry) or ``unroutable`` (no such partition), a broken producer to ``broken``."""
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                break
            except BufferError:
                self.producer.poll(0.05)  # local queue full: let deliveries drain
            except KafkaException as exc:
                partition = kwargs.get("partition")
                if (
                    partition is not None
                    and protocol.redelivery_bases(topic)
                    and self._lacks_partition(exc, topic, partition)
                ):
                    # A redelivery topic made before it got its topic's partition count (0.4.0's
                    # scheduler made 3): the key's partitioner chooses, as before.
                    log.warning(
                        "redelivery topic %s has no partition %s (give it as many as its topic, for "
                        "ordered mode): published by key", topic, partition,
                    )  # fmt: skip
                    del kwargs["partition"]
                    continue
                if partition is not None and self._lacks_partition(exc, topic, partition):
                    # Retrying cannot help: the job is dead (invalid) and goes to the DLQ instead.
                    unroutable.append(
                        (
                            job_id,
                            f"header retry.original-partition={partition}: topic {topic} has no such partition",
                        )
                    )
                else:
                    failed.append((job_id, f"produce failed: {exc}"))
                    if exc.args[0].fatal() or exc.args[0].code() in _BROKEN_PRODUCER:
                        broken.append(exc.args[0])
                break

    def _advance_holds(
        self, rows: list[OutgoingRow], acked: list[tuple[int, int]], unroutable: list[tuple[int, str]]
    ) -> None:
        """Ordered mode: a held job published lets the next of its chain fall due; a chain's head found
        unroutable (dead) releases its chain as dead. In the claim's transaction, with the marks."""
        published = {job_id for job_id, _ in acked}
        held = [row.held_by for row in rows if row.held_by is not None and row.id in published]
        dead_chains: dict[str, str] = {}
        dead_ids: list[str] = []
        if unroutable:
            dead = {job_id for job_id, _ in unroutable}
            for row in rows:
                if row.id in dead:
                    dead_ids.append(row.retry_id)
                    chain = chain_headed(row)
                    if chain is not None:
                        dead_chains[chain] = row.retry_id
        if held or dead_ids:
            self.store.queue.advance_holds(held, dead_chains=dead_chains, dead_ids=dead_ids)

    def _forget_released_chains(self) -> None:
        """Every :data:`FORGET_CHAINS_EVERY_S`, ordered mode's upkeep: forget the released chains
        nothing has waited in for :data:`RELEASED_CHAIN_KEEP_S`, so their table does not grow for ever;
        release the chains whose oldest waiting record is past its policy's ``max_age``
        (:func:`~retry_scheduler.db.chains.expire_chains`); report the chains' gauges."""
        now = time.monotonic()
        if now - self._chains_forgotten_at < FORGET_CHAINS_EVERY_S:
            return
        self._chains_forgotten_at = now
        forgotten = self.store.queue.forget_released_holds(RELEASED_CHAIN_KEEP_S)
        if forgotten:
            log.info("forgot %s released chain(s) nothing has waited in for 7 days", forgotten)
        max_ages = self.deployment.max_ages
        if max_ages:
            expired = expire_chains(self.store.queue, max_ages, int(self.clock() * 1000))
            if expired.chains:
                log.warning(
                    "%s chain(s) past their policy's max_age released as if their heads had expired "
                    "(%s pending head(s) dead): %s",
                    len(expired.chains), len(expired.heads_dead), expired.chains[:10],
                )  # fmt: skip
        if not isinstance(self.metrics, NoMetrics):
            try:
                waiting = self.store.readings.chains_waiting()
            except Exception as exc:  # metrics never stop the loop
                log.warning("chains' gauges skipped: %s: %s", type(exc).__name__, exc)
                return
            for name, value in waiting.gauges().items():
                self.metrics.gauge(f"retry_scheduler.chains.{name}", value)

    def _lacks_partition(self, exc: KafkaException, topic: str, partition: int) -> bool:
        """Whether ``exc`` says the partition is unknown and fresh metadata confirms ``topic`` lacks it."""
        if exc.args[0].code() != KafkaError._UNKNOWN_PARTITION:
            return False
        try:
            meta = self.producer.list_topics(topic, timeout=10).topics.get(topic)
        except KafkaException:
            return False
        return meta is not None and meta.error is None and partition not in meta.partitions

    def publish_once(self) -> PublishCounts:
        """One round: dead jobs to their DLQ topic, then due jobs to their destination.

        Due jobs are claimed, produced, acknowledged and marked inside one transaction that holds
        their row locks (see ``Queue.claim_due``): one write per job. Dead jobs take a lease instead,
        which also tells DLQ operations that a job is being sent right now.
        """
        counts = PublishCounts()
        began = time.perf_counter()
        phases: dict[str, float] = {}  # seconds of the round's parts, for a round that is slow
        s = self.settings
        failed: list[tuple[int, str]] = []
        dead_rows = self.store.queue.claim_dead(s.publish_batch, s.lease_ms, self.worker)
        if dead_rows:
            acked_dead, failed_dead, _ = self._produce_all(dead_rows, to_dlq=True)
            faults.checkpoint("publish.dlq_produced")
            counts.dead_published = self.store.queue.mark_dlq_published(acked_dead)
            failed += failed_dead
        phases["dead jobs to their DLQ"] = time.perf_counter() - began
        with self.store.conn.transaction():
            floor, claim_began = self.claim_floor(), time.monotonic()
            try:
                due_rows = self.store.queue.claim_due(s.publish_batch, floor=floor)
            finally:
                self._swept()
            self._after_claim(floor, due_rows, claim_began)
            lane_rows = self.claim_lanes(due_rows)
            counts.fair_claimed = len(lane_rows)
            due_rows = due_rows + lane_rows
            for gate in self.gates:
                due_rows, kept = gate.apply(due_rows)
                counts.keep(gate.counts_as, kept)
            acked: list[tuple[int, int]] = []
            failed_due: list[tuple[int, str]] = []
            phases["claim"] = time.monotonic() - claim_began
            if due_rows:
                produced = time.perf_counter()
                acked, failed_due, unroutable = self._produce_all(due_rows, to_dlq=False)
                phases["produce and acknowledgements"] = time.perf_counter() - produced
                faults.checkpoint("publish.produced")
                counts.published = self.store.queue.mark_published(acked)
                failed += failed_due
                if unroutable:
                    log.warning(
                        "%s jobs are dead (invalid): %s",
                        self.store.queue.mark_invalid(unroutable),
                        unroutable[0][1],
                    )
                self._advance_holds(due_rows, acked, unroutable)
            if failed:
                backed_off = self.store.queue.mark_failed(failed)
                counts.failed = len(backed_off)
                due_ids = {row.id for row in due_rows}
                self.come_back([(due, in_s) for job_id, due, in_s in backed_off if job_id in due_ids])
        self.say_found_below()
        for gate in self.gates:
            gate.after(due_rows, acked, failed_due)
        counts.claimed = len(dead_rows) + len(due_rows) + counts.kept_back
        if counts.claimed:
            counts.slowest_round_s, counts.slowest_round_jobs = time.perf_counter() - began, counts.claimed
            if counts.slowest_round_s > SLOW_ROUND_S:
                counts.say_slow(phases)
        if failed:
            for _, error in failed:
                counts.errors[error] = counts.errors.get(error, 0) + 1
            log.warning("%s deliveries failed, will retry after backoff: %s", len(failed), counts.errors)
        return counts

    def run(
        self, duration_s: float, should_stop: Callable[[], bool] = lambda: False, grace_s: float | None = None
    ) -> PublishCounts:
        """Publish for ``duration_s`` (then until a newer loop takes over, within the grace),
        waking up as jobs fall due.

        With ``publish_workers`` above 1, helper publishers (each with its own connection and
        producer, in threads) work beside this one: while one waits for PostgreSQL or the broker,
        another produces. SKIP LOCKED keeps their jobs apart. A helper's error stops them all and is
        raised here.
        """
        grace = self.settings.loop_grace_ms / 1000 if grace_s is None else grace_s
        stop = threading.Event()
        self.helpers = []
        threads: list[threading.Thread] = []
        tenure: LoopTenure | None = None
        try:
            for n in range(1, self.settings.publish_workers):
                helper = Publisher(
                    self.deployment,
                    self.store_factory(self.settings.database_url),
                    clock=self.clock,
                    store_factory=self.store_factory,
                    metrics=self.metrics,
                    gates=self.make_gates,
                )
                helper._sweeping = self._sweeping
                self.helpers.append(helper)
                threads.append(
                    threading.Thread(
                        target=helper.work,
                        args=(stop,),
                        kwargs={"helper": True},
                        name=f"publish-{n}",
                        daemon=True,
                    )
                )
            # Not a job claimed before every producer can publish at once: a loop still running
            # goes on until this one's first heartbeat (the tenure's) relieves it.
            wait_until_ready([p.producer for p in (self, *self.helpers)], PRODUCER_READY_S)
            # Where the loop this one relieves claims (read before this one's first heartbeat
            # relieves it, while it is still alive to have recorded it).
            predecessor = self.store.loops.claim_state_alive(ALIVE_S)
            if predecessor is not None:
                for publisher in (self, *self.helpers):
                    publisher.take_over(*predecessor)
                log.info("claims start at the floor of the loop this one relieves: %s", predecessor[0])
            tenure = current = self._tenure = LoopTenure(self.store.loops, "publish", duration_s, grace)
            for thread in threads:
                thread.start()
            self.work(stop, lambda: current.go_on() and not should_stop(), current.remaining_s)
        finally:
            stop.set()
            for thread in threads:
                if thread.is_alive():
                    thread.join()
            for helper in self.helpers:
                helper.close()
                helper.store.close()
            self._tenure = None
            if tenure is not None:
                tenure.finish()
        for helper in self.helpers:
            if helper.error is not None:
                raise helper.error
        total = PublishCounts()
        for publisher in (self, *self.helpers):
            total.add(publisher.totals)
        return total

    def _report(self, batch: PublishCounts, *, snapshot: bool) -> None:
        """A round's counts as metrics; now and then (``snapshot``) the backlog and lateness too."""
        m = self.metrics
        m.incr("retry_scheduler.publish.published", batch.published)
        m.incr("retry_scheduler.publish.dead_published", batch.dead_published)
        m.incr("retry_scheduler.publish.delivery_failures", batch.failed)
        if batch.claimed:
            m.gauge("retry_scheduler.publish.batch_size", batch.claimed)
        now = self.clock()
        if not snapshot or now - self._snapshot_at < SNAPSHOT_EVERY_S:
            return
        self._snapshot_at = now
        # Every lateness read (this snapshot, the task's summary, status, retry_monitor) stays cheap
        # however long since the last VACUUM.
        self.store.queue.summarize_published()
        if isinstance(m, NoMetrics):
            return
        try:
            reading = self.store.readings.metrics_reading()
        except Exception as exc:  # metrics never stop the loop; the next round's claim meets a real fault
            log.warning("metrics snapshot skipped: %s: %s", type(exc).__name__, exc)
            return
        m.gauge("retry_scheduler.publish.backlog_due", reading.backlog_due)
        m.gauge("retry_scheduler.publish.oldest_overdue_s", reading.oldest_overdue_s)
        for name, seconds in (("p50", reading.lateness_p50_s), ("p99", reading.lateness_p99_s)):
            if seconds is not None:
                m.timing(f"retry_scheduler.publish.lateness_{name}", seconds * 1000)

    def published_so_far(self) -> int:
        """Jobs published by this publisher and its helpers in the current ``run`` (read while it runs)."""
        return sum(p.totals.published for p in (self, *self.helpers))

    def work(
        self,
        stop: threading.Event,
        go_on: Callable[[], bool] = lambda: True,
        remaining_s: Callable[[], float] = lambda: float("inf"),
        *,
        helper: bool = False,
    ) -> None:
        """Publish rounds until ``stop`` is set or ``go_on`` says no; adds to ``totals``.

        A helper keeps its error in ``error`` (raised by ``run``) instead of raising it in its thread.
        """
        poll_s = self.settings.poll_interval_ms / 1000
        try:
            while not stop.is_set() and go_on():
                batch = self.publish_once()
                if batch.claimed:
                    log.info(
                        "claimed %s jobs: %s published, %s to DLQ, %s failed%s",
                        batch.claimed, batch.published, batch.dead_published, batch.failed,
                        "".join(f", {n} {what}" for n, what in ((batch.paused, "paused by a breaker"),
                                (batch.deferred, "put off by a rate limit"),
                                *((n, f"kept back ({g})") for g, n in batch.gated.items())) if n),
                    )  # fmt: skip
                self.totals.add(batch)
                self._report(batch, snapshot=not helper)
                if not helper:
                    self._share_floor()
                    if self.vacuum is not None:
                        self.vacuum.tick(self.store.queue)
                    self._forget_released_chains()
                    for gate in self.gates:
                        gate.tick()
                if batch.claimed >= self.settings.publish_batch:
                    continue  # more may be waiting
                wait = self.store.queue.seconds_until_next_due(after=self.store.queue.claimed_up_to)
                nap = poll_s if wait is None else min(poll_s, max(0.0, wait))
                stop.wait(min(nap, remaining_s()))
        except Exception as exc:
            stop.set()  # one publisher failing stops them all: the task fails and Airflow retries it
            if not helper:
                raise
            self.error = exc
