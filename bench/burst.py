"""A burst: a million retries at once while steady traffic goes on, under the real Airflow scheduler.

A team whose downstream service goes down sends its consumer's failures to be retried as fast as it
reads them. ``burst_ingest_msgs_per_s``: ``burst_records`` records are sent by one producer (a
process of its own) at ``burst_send_rate`` a second (32 000 by default, above the 30 000/s target;
0: as fast as it can) to the header-driven retry topic, the **same** one the steady traffic is sent
to, each with a ``retry.at`` ``burst_due_s`` after it was sent, and counted from the first send to the
start of the ingest transaction that stored the last one (found on the ingest's stored offsets
reaching the topic's end offsets as they were when the burst's last record was acknowledged). Stored
as fast as it is sent, the figure is about the send rate, less the last records' store time.
``burst_publish_late_s``: the worst lateness of the burst's records (target: published within 60 s of
their due time).

``burst_steady_p99_s``: steady traffic at ``burst_steady_rate``/s, each record due 5 s after it is sent
to the same retry topic, runs alone for ``burst_baseline_s`` (its p99 then is the baseline,
``burst_steady_baseline_p99_s``) and goes on through the burst; the figure is the p99 of the steady
records due from the burst's first send to its last acknowledgement.

A Kafka partition is read in order: steady records sent behind the burst's on the same partitions
wait until the ingest has read what is ahead of them. While the ingest keeps pace with the burst they
wait for nothing; a burst sent faster than the ingest stores it leaves a backlog, and their lateness
is about that backlog over the ingest rate, less the 5 s of delay they had (``--burst-rate 0`` shows
how much on a given host). A team that may flood faster than that keeps it away from others with a
retry (or delay) topic of its own: the ingest's fetches take from every partition in turn.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.capacity import DUE_IN_MS, cpu_budget, live_stack
from bench.cpu import ProcessCpu, cpu_shares, cpu_times
from bench.env import BenchEnv, BenchError, Result
from bench.held import table_sampler
from bench.sizes import Sizes
from bench.slow import steady_producer
from bench.timeline import lateness_between, lateness_timeline
from bench.waits import topic_end, wait_not_pending, wait_stored

log = logging.getLogger(__name__)

#: The burst's records are published at most this long after their due time (the issue's target).
MAX_BURST_LATE_S = 60.0
#: How long after the burst's due time its records may take before the measurement gives up on them.
PUBLISH_DEADLINE_S = 600


def _summary(env: BenchEnv, destination: str) -> dict[str, Any]:
    row = env.sql("bench_burst_summary", {"destination": destination}, fetch=True)[0]
    keys = ("stored", "published", "early", "last_stored", "first_due", "last_due", "last_published",
            "p99_s", "max_s")  # fmt: skip
    return dict(zip(keys, row, strict=True))


def _wait_published(env: BenchEnv, destination: str, expected: int, deadline_s: float) -> dict[str, Any]:
    """Wait until none of ``destination``'s jobs is pending and ``expected`` are published (or the
    deadline); returns the summary. The summary (a scan of every job of the destination, with a
    sort for the p99) is read only once nothing is pending: polled each second through a drain of a
    million jobs it would take a share of the two cores the drain is measured on."""
    deadline = time.monotonic() + deadline_s
    while True:
        wait_not_pending(env, destination, deadline, every_s=1.0)
        summary = _summary(env, destination)
        if summary["published"] >= expected or time.monotonic() >= deadline:
            return summary
        time.sleep(1)


def _store_window(
    before: dict[str, float], after: dict[str, float], machine: dict[str, float] | None
) -> dict[str, Any]:
    """The CPU of the window in which the burst was sent and stored: core-seconds by kind of process
    (what was sampled of each) and the machine's busy share."""
    used = {kind: round(after.get(kind, 0.0) - before.get(kind, 0.0), 2) for kind in after}
    ranked = dict(sorted(((k, v) for k, v in used.items() if v > 0), key=lambda kv: -kv[1]))
    return {"core_s": ranked, "machine_cpu": machine}


def _send_burst(bootstrap: str, topic: str, records: int, destination: str, due_s: int, rate: int) -> float:
    """Send the burst from a process of its own (and so a core: "as fast as the producer can", and the
    steady producer's thread is not starved of the GIL meanwhile), each record due ``due_s`` after it
    is produced, at most ``rate`` a second (0: no limit); returns the seconds it took."""
    code = (
        "import sys; from bench.env import produce_records; "
        "print(produce_records(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], None, "
        "due_in_ms=int(sys.argv[5]), rate=int(sys.argv[6]) or None))"
    )
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", code, bootstrap, topic, str(records), destination, str(due_s * 1000), str(rate)],
        capture_output=True, text=True, env=env, timeout=PUBLISH_DEADLINE_S,
    )  # fmt: skip
    if done.returncode:
        raise BenchError(f"burst: the producer failed: {done.stderr.strip()[-2000:]}")
    return float(done.stdout.split()[-1])


def measure_burst(env: BenchEnv, sizes: Sizes) -> Result:
    """The burst's ingest rate and lateness, and the steady traffic's lateness before and during it."""
    result = Result("burst")
    autovacuum = env.sql("bench_autovacuum", {}, fetch=True)[0][0] == "on"
    tag = uuid.uuid4().hex[:6]
    burst_dest, steady_dest = f"bench.burst-{env.tag}-{tag}", f"bench.steady-{env.tag}-{tag}"
    env.create_topics([burst_dest, steady_dest])
    stop = threading.Event()
    sent_box: list[int] = []
    with (
        live_stack(env, "burst") as stack,
        table_sampler(env) as table,
        contextlib.ExitStack() as cleanup,
    ):
        settings = stack.settings
        steady = threading.Thread(
            target=lambda: sent_box.append(
                steady_producer(
                    settings.bootstrap_servers, settings.retry_topic, steady_dest, sizes.burst_steady_rate,
                    float("inf"), DUE_IN_MS, tag, stop,
                )
            ),
            name="bench-burst-steady",
        )  # fmt: skip
        metadata_url = stack.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        machine_before, began = cpu_times(), time.time()
        cpu = cleanup.enter_context(ProcessCpu())
        steady.start()
        cleanup.callback(steady.join)
        cleanup.callback(stop.set)
        time.sleep(sizes.burst_baseline_s)
        topic = settings.retry_topic
        burst_began, cpu_at_burst, machine_at_burst = time.time(), cpu.running_seconds(), cpu_times()
        send_s = _send_burst(
            settings.bootstrap_servers, topic, sizes.burst_records, burst_dest, sizes.burst_due_s,
            sizes.burst_send_rate,
        )  # fmt: skip
        log.info("burst: %s records sent in %.1f s", sizes.burst_records, send_s)
        # Stored once the ingest reached where the topic ended when the last one was acknowledged
        # (the steady records sent meanwhile are behind or among them). Every live stack of a run
        # ingests `retry` under the DAG's one consumer group (Airflow's environment names none: the
        # default), so its stored offsets are the only rows of the topic and their sum goes on from
        # where the run's earlier stacks left it, as the topic's end offsets do.
        wait_stored(env, topic, 0, topic_end(settings.bootstrap_servers, topic), PUBLISH_DEADLINE_S)
        store_window = _store_window(
            cpu_at_burst, cpu.running_seconds(), cpu_shares(machine_at_burst, cpu_times())
        )
        burst = _wait_published(
            env, burst_dest, sizes.burst_records, sizes.burst_due_s + send_s + PUBLISH_DEADLINE_S
        )
        time.sleep(5)  # steady records due just after the burst's last acknowledgement are in its wake
        stop.set()
        steady.join()
        sent = sent_box[0] if sent_box else 0
        steady_summary = _wait_published(env, steady_dest, sent, 120)
        cleanup.close()  # the CPU counters stop here
        ended = time.time()
        machine = cpu_shares(machine_before, cpu_times())
        steady_timeline = lateness_timeline(env, steady_dest, metadata_url, began, ended)
        per_second = env.sql("bench_stored_published_per_second", {"destination": burst_dest}, fetch=True)
    if burst["published"] < sizes.burst_records:
        raise BenchError(
            f"burst: {burst['published']:,} of {sizes.burst_records:,} records published within "
            f"{PUBLISH_DEADLINE_S} s of their due time ({burst['stored']:,} stored)"
        )
    last_ack = float(burst["last_published"])
    ingest_s = float(burst["last_stored"]) - burst_began
    baseline = lateness_between(env, steady_dest, began, burst_began)
    during = lateness_between(env, steady_dest, burst_began, last_ack)
    after = lateness_between(env, steady_dest, last_ack, ended)
    result.figures = {
        "burst_ingest_msgs_per_s": round(sizes.burst_records / ingest_s, 1) if ingest_s > 0 else None,
        "burst_publish_late_s": round(float(burst["max_s"]), 3),
        "burst_steady_p99_s": during["p99_s"],
        "burst_steady_baseline_p99_s": baseline["p99_s"],
    }
    result.details = {
        "records": sizes.burst_records,
        "due_s": sizes.burst_due_s,
        "topic": settings.retry_topic,
        "send_rate": sizes.burst_send_rate or None,
        "send_s": round(send_s, 2),
        "sent_per_s": round(sizes.burst_records / send_s, 1) if send_s > 0 else None,
        "ingest_s": round(ingest_s, 2),
        "burst": {
            "stored": int(burst["stored"]),
            "published": int(burst["published"]),
            "early": int(burst["early"]),
            "p99_s": round(float(burst["p99_s"]), 3),
            "max_s": round(float(burst["max_s"]), 3),
            "published_s_after_first_due": round(last_ack - float(burst["first_due"]), 2),
            "due_span_s": round(float(burst["last_due"]) - float(burst["first_due"]), 2),
        },
        "steady": {
            "rate_per_s": sizes.burst_steady_rate,
            "due_in_ms": DUE_IN_MS,
            "baseline_s": sizes.burst_baseline_s,
            "sent": sent,
            "published": int(steady_summary["published"]),
            "early": int(steady_summary["early"]),
            "before_burst": baseline,
            "during_burst": during,
            "after_burst": after,
            **steady_timeline,
        },
        # Seconds from the steady traffic's start: [second, burst records stored, acknowledged].
        "burst_timeline": [[round(s - began), int(n), int(p)] for s, n, p in per_second],
        "burst_began_s": round(burst_began - began, 1),
        "table_timeline": table,
        "machine_cpu": machine,
        # From the first send to when every burst record was found stored (polled each 0.5 s).
        "store_window_cpu": store_window,
        **cpu_budget(cpu.seconds(), sizes.burst_records + sent),
        "max_burst_late_s": MAX_BURST_LATE_S,
        "autovacuum": autovacuum,
    }
    published_in = round(last_ack - float(burst["first_due"]), 1)
    result.notes = [
        f"{sizes.burst_records:,} records sent by one producer process "
        f"({f'at most {sizes.burst_send_rate:,}/s' if sizes.burst_send_rate else 'as fast as it could'}) "
        f"to the retry topic {settings.retry_topic}, "
        f"the steady traffic's (due {sizes.burst_due_s} s after each was sent), in {send_s:.1f} s "
        f"({result.details['sent_per_s']:,.0f}/s), stored by {ingest_s:.1f} s after the first send: "
        f"{result.figures['burst_ingest_msgs_per_s']:,.0f}/s.",
        f"The burst published from its first due time to its last acknowledgement in {published_in} s "
        f"(its due times spanned {result.details['burst']['due_span_s']} s), none early "
        f"({burst['early']} early), p99 {result.details['burst']['p99_s']} s, worst "
        f"{result.figures['burst_publish_late_s']} s after its due time.",
        f"Steady traffic at {sizes.burst_steady_rate:,}/s (due {DUE_IN_MS / 1000:g} s after each was sent, "
        f"on the same topic): alone for {sizes.burst_baseline_s} s p99 {baseline['p99_s']} s; "
        f"due during the burst ({during['published']:,} records) p99 {during['p99_s']} s, worst "
        f"{during['max_s']} s; after it p99 {after['p99_s']} s; "
        f"{steady_summary['early']} early of {sent:,}.",
        "While the burst was sent and stored: the machine "
        f"{(store_window['machine_cpu'] or {}).get('busy_pct')} % busy; core-seconds "
        + ", ".join(f"{kind} {s}" for kind, s in list(store_window["core_s"].items())[:8])
        + ".",
        f"autovacuum {'on' if autovacuum else 'off'}; retry_jobs at most "
        f"{max((r[1] for r in table), default=0):,} dead rows, {max((r[3] for r in table), default=0)} MB.",
    ]
    return result
