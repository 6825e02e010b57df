"""Chaos runs: kill, freeze and restart the parts of the service under load, then account for every record.

``retry-scheduler chaos`` (``make chaos``) starts a PostgreSQL of its own (the machine's binaries, a
temporary directory, a free port) and an Apache Kafka 4.4 broker of its own, so restarting the one or freezing
the other disturbs nothing else on the machine. Each trial gets a fresh database and fresh topics, runs
the ingest and publish loops as separate OS processes (``retry-scheduler run --only ...``), sends a
workload of a few thousand records and injects one fault at a random point:

* ``kill_ingest_consumed`` / ``kill_ingest_stored``: SIGKILL of the ingest worker after the N-th batch
  was consumed (before its DB commit) or stored (before its offset commit);
* ``kill_publish_produced`` / ``kill_publish_dlq_produced``: SIGKILL of the publish worker after the
  broker acknowledged its N-th round of retries (of dead records), before the jobs were marked;
* ``kill_anytime``: SIGKILL of either worker at a random moment;
* ``broker_pause``: the broker frozen (SIGSTOP) for 1-8 s while publishing, then SIGCONT;
* ``postgres_restart_ingest`` / ``postgres_restart_publish``: PostgreSQL stopped (fast or immediate
  shutdown) and started again while ingesting, or while publishing.

Points inside the service come from :mod:`retry_scheduler.core.faults` (``RETRY_FAULT``). A worker that
dies is started again a second later, as the next DAG run would. Once every job is published or dead
and on its DLQ topic, the harness reads the retry, destination and DLQ topics and counts: **lost**
(a record not on the topic its headers and policy call for), **duplicates** (a record twice on a
topic) and **unidentified duplicates** (copies whose ``retry.id`` or ``retry.attempt`` differ).
Before the trials, a corpus of bad input is sent to a running service: each record must end dead
(``invalid``) with a reason naming its fault and be on the DLQ, and the same ingest process must
go on to ingest a good record sent after them.

``retry-scheduler chaos --cluster`` (``make chaos-cluster``) runs the trials of a Kafka cluster failing
instead, on three brokers and two controllers only: partition leaders, the group coordinator and the
active controller killed, a rolling restart, two brokers down, a broker frozen
(:mod:`bench.chaos.cluster`); they are the ``cluster`` entry of ``chaos.json``.

``retry-scheduler chaos --postgres-failover`` (``make chaos-failover``) runs the trials of the
PostgreSQL primary killed and its replica promoted, on a primary and a streaming replica
(:mod:`bench.chaos.failover`); they are the ``failover`` entry of ``chaos.json``.

A run keeps its folder (the workers' logs, PostgreSQL's data) when a trial failed, or with
``CHAOS_KEEP=1``.
"""

from __future__ import annotations

from bench.chaos.cluster import CLUSTER_FAULTS
from bench.chaos.common import FAULTS, ChaosError
from bench.chaos.failover import FAILOVER_FAULTS
from bench.chaos.run import run_chaos
from bench.chaos.topics import Seen, create_topics, read_topics

__all__ = [
    "CLUSTER_FAULTS",
    "FAILOVER_FAULTS",
    "FAULTS",
    "ChaosError",
    "Seen",
    "create_topics",
    "read_topics",
    "run_chaos",
]
