"""Trials of the bulk paths: a bulk retry, a compaction or a DLQ replay killed (-9) mid-way, then run again.

Each trial first lets the loops settle a workload (every job published, or dead and on its DLQ topic),
then runs the operation as an operator would, ``retry-scheduler bulk-retry | compact | dlq replay``, in
a session of its own with a ``RETRY_FAULT`` plan: at a checkpoint of :mod:`retry_scheduler.core.faults`
the whole job dies (the command, spark-submit's JVM, the Python driver and workers). The operation is
then run once more without a plan, as Airflow's retry of the task would, and the trial counts:

* ``bulk_retry_kill``, ``dlq_replay_kill`` and ``watched_replay_kill`` (a watched replay, its canary
  first, killed while a wave is watched; every workload record dead): each record is on the DLQ
  topic, as before, and on its destination at least once after the replay; copies of one record carry
  the same ``retry.id`` and ``retry.attempt``.
* ``compaction_kill`` (killed between the archive's write and the first delete, or between two delete
  batches): every job that was in PostgreSQL before is in the Parquet archive with its key and value,
  and none is left in PostgreSQL; a job twice in the archive is a duplicate identified by its id.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.chaos.common import FAULTS
from bench.chaos.failover import FAILOVER_BULK_RETRY, FAILOVER_FAULTS, failover_striker, plan_failover_fault
from bench.chaos.stack import ChaosStack, Supervisor, Worker, worker_env
from bench.chaos.topics import Topics, read_topics, send, wait_done
from bench.chaos.trial import Expected, Tally, TrialGround, TrialResult, account, workload

log = logging.getLogger(__name__)

BULK_FAULTS = ("bulk_retry_kill", "compaction_kill", "dlq_replay_kill", "watched_replay_kill")
#: Every kind :func:`run_bulk_trial` runs.
BULK_PATH_FAULTS = (*BULK_FAULTS, FAILOVER_BULK_RETRY)
#: A watched replay's canary (then the rest in one wave: a trial holds fewer than 10 000 records).
CANARY = 50
#: Small batches, so that a trial of a few thousand records has many of them to be killed between.
MARK_BATCH, DELETE_BATCH, REPLAY_BATCH = 50, 100, 100
#: The longest one run of an operation may take (a Spark job starts in 10-20 s here).
JOB_TIMEOUT_S = 300


def plan_bulk_fault(fault: str, rng: random.Random, records: int) -> tuple[dict[str, Any], str | None]:
    """Where the operation dies: the parameters (for the report) and its ``RETRY_FAULT`` plan.

    Checkpoints are counted per process: a bulk retry's acknowledged batches by each of Spark's Python
    workers (two on two cores), so the N is drawn from the first half of one worker's share.
    """
    if fault in FAILOVER_FAULTS:  # the primary killed (bench/chaos/failover.py), not the job
        return plan_failover_fault(fault, rng, records), None
    if fault == "bulk_retry_kill":
        n = rng.randint(1, max(1, records // MARK_BATCH // 4))
        return {"checkpoint": "bulk_retry.acked", "n": n, "mark_batch": MARK_BATCH}, f"bulk_retry.acked:{n}"
    if fault == "dlq_replay_kill":
        n = rng.randint(1, max(1, records // REPLAY_BATCH - 1))
        return {"checkpoint": "dlq.batch", "n": n, "batch_size": REPLAY_BATCH}, f"dlq.batch:{n}"
    if fault == "watched_replay_kill":
        n = rng.randint(1, 2)  # while the canary is watched, or the wave after it
        return {"checkpoint": "dlq.watch", "n": n, "canary": CANARY}, f"dlq.watch:{n}"
    if fault == "compaction_kill":
        if rng.random() < 0.5:
            return {"checkpoint": "compaction.archived", "n": 1}, "compaction.archived:1"
        n = rng.randint(1, max(1, records // DELETE_BATCH - 1))
        return {"checkpoint": "compaction.deleted", "n": n, "delete_batch": DELETE_BATCH}, (
            f"compaction.deleted:{n}"
        )
    raise ValueError(f"unknown fault {fault!r} (known: {', '.join(FAULTS)})")


def operation(fault: str, topics: Topics, archive: str) -> list[str]:
    """The operator's command for the trial's fault (after ``retry-scheduler``)."""
    if fault in ("bulk_retry_kill", FAILOVER_BULK_RETRY):
        return ["bulk-retry", "--destination", topics.dest, "--mark-batch", str(MARK_BATCH)]
    if fault == "dlq_replay_kill":
        return ["dlq", "replay", "--destination", topics.dest, "--batch-size", str(REPLAY_BATCH), "--yes"]
    if fault == "watched_replay_kill":
        return [
            "dlq", "replay", "--destination", topics.dest, "--batch-size", str(REPLAY_BATCH),
            "--canary", str(CANARY), "--stop-above", "50%", "--verdict-window", "1s", "--yes",
        ]  # fmt: skip
    return [
        "compact", "--older-than", "0s", "--dead-retention", "0s", "--archive", archive,
        "--delete-batch", str(DELETE_BATCH),
    ]  # fmt: skip


def run_job(args: list[str], env: dict[str, str], log_path: Path, fault: str | None) -> int:
    """Run ``retry-scheduler ARGS`` in a session of its own; its exit status (-9: killed)."""
    env = dict(env)
    if fault:
        env["RETRY_FAULT"] = fault
    cmd = [sys.executable, "-m", "retry_scheduler.cli.main", *args]
    with open(log_path, "ab") as out:
        out.write(f"--- {' '.join(args)} (fault {fault or 'none'})\n".encode())
        out.flush()
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return proc.wait(JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            out.write(f"--- killed by the harness after {JOB_TIMEOUT_S} s\n".encode())
            return -signal.SIGKILL * 1000  # not the fault's kill


def _wait_for(database_url: str, query: str, expected: int, timeout_s: float) -> bool:
    import psycopg

    deadline = time.monotonic() + timeout_s
    with psycopg.connect(database_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(query).fetchone()
            if row and row[0] == expected:
                return True
            time.sleep(0.1)
    return False


def account_replayed(expected: list[Expected], seen: dict[str, list[Any]], topics: Topics) -> Tally:
    """Every record dead on the DLQ topic (as before the operation) and published once it ran."""
    tally = account(expected, seen[topics.retry], [], seen[topics.dlq])
    # Published by the replay: no due time to check; the attempt raised from the one stored.
    again = [replace(e, outcome="published", due_ms=None, delay_ms=None) for e in expected]
    tally.add(account(again, seen[topics.retry], seen[topics.dest], []))
    tally.records = len(expected)
    return tally


def snapshot(database_url: str) -> dict[int, tuple[bytes | None, bytes | None]]:
    """Every job in PostgreSQL: id -> (key, value)."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        return {
            int(i): (k, v) for i, k, v in conn.execute("SELECT id, msg_key, msg_value FROM retry_jobs_all")
        }


def account_archive(
    before: dict[int, tuple[bytes | None, bytes | None]], left: set[int], root: Path
) -> Tally:
    """Every job of ``before`` in the archive under ``root`` with its key and value, or ``left`` in PostgreSQL."""
    import pyarrow.dataset as ds

    tally = Tally(records=len(before))
    archived: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    if root.exists():
        table = ds.dataset(root, format="parquet", partitioning="hive").to_table(
            columns=["id", "msg_key", "msg_value"]
        )
        columns = (table.column(c).to_pylist() for c in ("id", "msg_key", "msg_value"))
        for job_id, key, value in zip(*columns, strict=True):
            archived.setdefault(int(job_id), []).append((key, value))
    for job_id, copies in archived.items():
        tally.duplicates += len(copies) - 1  # identified: one id is one job
        if job_id in before and any(copy != before[job_id] for copy in copies):
            tally.wrong_headers += 1
            tally.note(f"job {job_id}: key or value changed in the archive")
    for job_id in before:
        if job_id not in archived and job_id not in left:
            tally.lost += 1
            tally.note(f"job {job_id}: neither in PostgreSQL nor in the archive")
    return tally


def _failover(
    stack: ChaosStack, fault: str, detail: dict[str, Any], database_url: str, topics: Topics
) -> threading.Thread | None:
    """For a failover fault, the thread that kills the primary while the operation runs (started)."""
    if fault not in FAILOVER_FAULTS:
        return None
    assert stack.pair is not None, (
        f"{fault} is a fault of a replicated PostgreSQL: run chaos --postgres-failover"
    )
    strike = failover_striker(stack.pair, fault, detail, database_url, stack.bootstrap, topics)
    thread = threading.Thread(target=strike, name="chaos-failover")
    thread.start()
    return thread


def run_bulk_trial(
    stack: ChaosStack, index: int, fault: str, rng: random.Random, records: int, timeout_s: float = 120
) -> TrialResult:
    """One bulk-path trial on a fresh database and fresh topics; returns its count."""
    began = time.monotonic()
    ground = TrialGround.prepare(stack, index)
    topics, database_url, logs = ground.topics, ground.database_url, ground.logs
    detail, plan = plan_bulk_fault(fault, rng, records)
    archive_root = stack.work_dir / f"archive-{index:03d}"
    env = worker_env(stack, database_url, topics, RETRY_SPARK_MASTER="local[2]")
    workers = {
        kind: Worker(kind, env, logs / f"trial-{index:03d}-{kind}.log") for kind in ("ingest", "publish")
    }
    dead_only = fault != "compaction_kill"
    batch, expected = workload(rng, records, topics, int(time.time() * 1000), dead_only=dead_only)
    job_log = logs / f"trial-{index:03d}-job.log"
    command = operation(fault, topics, archive_root.as_uri())
    codes: list[int] = []
    with Supervisor(list(workers.values())):
        send(stack.bootstrap, topics.retry, batch, chunks=8, gap_s=0.15)
        settled = wait_done(database_url, records, timeout_s)
        before = snapshot(database_url) if fault == "compaction_kill" else {}
        if settled:
            striker = _failover(stack, fault, detail, database_url, topics)
            codes.append(run_job(command, env, job_log, plan))
            if striker is not None:
                striker.join()
            codes.append(run_job(command, env, job_log, None))  # Airflow's retry of the task
        if fault == "compaction_kill":
            done = _wait_for(database_url, "SELECT count(*) FROM retry_jobs_all", 0, 10)
        else:
            done = _wait_for(
                database_url, "SELECT count(*) FROM retry_jobs_all WHERE status <> 'published'", 0, timeout_s
            )
    detail["exit_codes"] = codes
    fired = (
        bool(detail.get("triggered"))
        if fault in FAILOVER_FAULTS
        else bool(codes) and codes[0] == -signal.SIGKILL
    )
    recovered = settled and len(codes) == 2 and codes[1] == 0 and done
    seen = read_topics(stack.bootstrap, topics.all)
    if fault == "compaction_kill":
        tally = account(expected, seen[topics.retry], seen[topics.dest], seen[topics.dlq])
        tally.add(account_archive(before, set(snapshot(database_url)), archive_root / "retry_jobs"))
        tally.records = len(expected)
        detail["archived_jobs"] = len(before)
    else:
        tally = account_replayed(expected, seen, topics)
    if recovered and tally.ok:
        ground.clear(stack)
    starts = {kind: w.starts for kind, w in workers.items()}
    starts["job"] = len(codes)
    return TrialResult(
        index, fault, detail, fired, recovered, round(time.monotonic() - began, 2), starts, tally
    )
