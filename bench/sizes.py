"""How much work each benchmark measurement does: the full sizes of ``make bench`` and the quick ones
of ``make test`` (no figure of a quick run is evidence)."""

from __future__ import annotations

from dataclasses import dataclass

#: The rate the burst is sent at by default (bench.burst): above the 30 000/s the issue sets, so that a
#: burst stored as fast as it is sent shows that rate (its last records' store time counts too).
BURST_RATE = 32_000


@dataclass(frozen=True)
class Sizes:
    """How much work each measurement does. ``quick`` sizes are for ``make test``: no figure is evidence."""

    ingest_records: int = 500_000
    ingest_warmup: int = 5_000
    publish_rows: int = 100_000
    pgqueuer_rows: int = 100_000
    pgqueuer_batch_sizes: tuple[int, ...] = (10, 100, 1000)
    naive_rows: int = 5_000
    claim_small: int = 10_000
    claim_large: int = 10_000_000
    claim_due: int = 5_000
    claim_limit: int = 1_000
    claim_repeats: int = 21
    spark_rows: int = 1_000_000
    lateness_rate: int = 1_000
    lateness_seconds: int = 300
    #: Retry rates (records/s) the capacity measurement steps through, each for capacity_seconds.
    capacity_rates: tuple[int, ...] = (1_000, 1_500, 2_000, 2_500, 3_000, 4_000, 5_000, 7_500, 10_000, 12_500)
    capacity_seconds: int = 300
    capacity_publish_rows: int = 200_000
    #: The Celery worker counts the capacity measurement publishes capacity_publish_rows with.
    #: Either this or capacity_rates may be empty: that part is then not measured (the tests run the
    #: rate steps alone, on the whole machine, and the Celery part beside other tests).
    capacity_celery_workers: tuple[int, ...] = (1, 2)
    #: The held-snapshot windows' rate (half the capacity target) and length.
    held_rate: int = 5_000
    held_seconds: int = 600
    #: The dead jobs the third held-snapshot window bulk-retries through Spark beside the loop (0: none).
    held_spark_rows: int = 1_000_000
    #: The burst: records sent at burst_send_rate/s to the steady traffic's retry topic, each due
    #: burst_due_s after it was sent, while steady traffic (burst_steady_rate/s, due in 5 s) goes on;
    #: the steady traffic runs alone for burst_baseline_s first.
    burst_records: int = 1_000_000
    #: The rate the burst is sent at (records a second); 0: as fast as one producer can.
    burst_send_rate: int = BURST_RATE
    burst_due_s: int = 120
    burst_steady_rate: int = 1_000
    burst_baseline_s: int = 60
    #: The soak: half the capacity target for half an hour.
    soak_rate: int = 5_000
    soak_seconds: int = 1_800
    #: Ordered mode (bench.ordered): records through the helper with and without it, over this many
    #: keys; then a chain of ordered_chain records behind each key's first (failing) record.
    ordered_records: int = 20_000
    ordered_keys: int = 20
    ordered_chain: int = 200
    #: Fair publishing (bench.fairness): a flood of one destination's due jobs, and a small stream of
    #: another's falling due evenly over fairness_window_s while the flood drains.
    fairness_flood: int = 1_000_000
    fairness_small: int = 1_000
    fairness_window_s: float = 15.0
    #: ... the first of them due this long after it is stored (the publisher starts at once).
    fairness_first_due_s: float = 5.0
    #: The ingest handover (bench.handover): steady traffic this long at this rate while the stack
    #: also adopts this many empty dead-letter topics (6 partitions each, 42 partitions in all).
    handover_rate: int = 1_000
    handover_seconds: int = 300
    handover_topics: int = 6

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            ingest_records=2_000,
            ingest_warmup=500,
            publish_rows=2_000,
            pgqueuer_rows=2_000,
            pgqueuer_batch_sizes=(10,),
            naive_rows=200,
            claim_small=10_000,
            claim_large=50_000,
            claim_due=2_000,
            claim_repeats=3,
            spark_rows=20_000,
            lateness_rate=50,
            lateness_seconds=30,
            capacity_rates=(50, 100),
            capacity_seconds=10,
            capacity_publish_rows=2_000,
            held_rate=50,
            held_seconds=10,
            held_spark_rows=2_000,
            burst_records=3_000,
            burst_due_s=10,
            burst_steady_rate=50,
            burst_baseline_s=8,
            soak_rate=50,
            soak_seconds=20,
            ordered_records=1_000,
            ordered_keys=5,
            ordered_chain=20,
            fairness_flood=30_000,
            fairness_small=100,
            fairness_window_s=0.5,
            fairness_first_due_s=1.0,
            handover_rate=50,
            handover_seconds=10,
            handover_topics=2,
        )
