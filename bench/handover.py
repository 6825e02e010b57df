"""The ingest's gap at a loop handover, with many partitions, under the real Airflow scheduler.

``handover_gap_p50_s`` and ``handover_gap_max_s``: every minute a ``retry_scheduler`` run's ingest loop
hands the retry topics over to the next run's (:mod:`retry_scheduler.loops.handover`). While records
are sent to ``retry`` at ``handover_rate`` for ``handover_seconds``, the stack also adopts
``handover_topics`` dead-letter topics of :data:`~bench.env.PARTITIONS` partitions each (with
``retry``'s six, 42 partitions by default: the run that once showed a 90 s gap had 42). Each
handover's gap is the longest time with nothing stored near the old loop's end
(:func:`bench.timeline.store_gaps`); target: under a second.

The adopted topics carry no traffic: what is measured is the new loop's start over that many
partitions (their offsets planned, their worker processes assigned), which is what the gap was.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from bench.capacity import _environ, _step, live_stack
from bench.env import PARTITIONS, BenchEnv, Result
from bench.sizes import Sizes

log = logging.getLogger(__name__)


#: What an ingest loop logs when it shares the partitions among its worker processes.
_SHARING = re.compile(r"ingesting (\d+) partitions in \d+ worker processes")


def partitions_ingested(logs: Path) -> list[int]:
    """The partitions each ingest loop of a stack said it shared among its workers (its task logs
    under ``logs``), each count once, sorted: what the loops really read, not what was set up."""
    found: set[int] = set()
    for log_file in logs.glob("dag_id=retry_scheduler/*/task_id=ingest/*.log"):
        found.update(int(n) for n in _SHARING.findall(log_file.read_text(errors="replace")))
    return sorted(found)


def measure_handover(env: BenchEnv, sizes: Sizes) -> Result:
    """Steady traffic across several ingest handovers, with ``sizes.handover_topics`` adopted topics."""
    result = Result("handover")
    # A stack shared by the measurements of a run (the tests' short runs) ingests retry alone.
    own = not env.share_stack
    adopted = (
        [f"bench.handover-{env.tag}-dlq-{n}" for n in range(1, sizes.handover_topics + 1)] if own else []
    )
    if adopted:
        env.create_topics(adopted)
    partitions = PARTITIONS * (1 + len(adopted))
    # The Airflow processes take the stack's environment: they adopt the topics (the dead-letter
    # format is the Spring one; the topics stay empty).
    adopt = ",".join(f"{topic}=spring" for topic in adopted)
    with _environ(RETRY_ADOPT_TOPICS=adopt), live_stack(env, "handover") as stack:
        metadata_url = stack.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        step = _step(
            env, stack.settings, sizes.handover_rate, sizes.handover_seconds, metadata_url, "handover"
        )
        ingested = partitions_ingested(stack.airflow_home / "logs")
    gaps = step["handover_gaps_s"]
    result.details = {
        "step": step, "partitions": partitions, "partitions_ingested": ingested, "adopted_topics": adopted,
    }  # fmt: skip
    if gaps:
        result.figures["handover_gap_p50_s"] = step["handover_gap_p50_s"]
        result.figures["handover_gap_max_s"] = step["handover_gap_max_s"]
    else:
        for key in ("handover_gap_p50_s", "handover_gap_max_s"):
            result.details[f"why_{key}"] = (
                f"not measured: no ingest loop handed over inside the {sizes.handover_seconds} s of traffic "
                "(the DAG runs every minute: give it more than a minute)"
            )
    result.notes = [
        f"{step['sent']:,} records sent to retry at {sizes.handover_rate:,}/s for {sizes.handover_seconds} s "
        f"while the stack ingested {partitions} partitions ({len(adopted)} adopted "
        f"topics besides retry; the ingest loops said they shared {', '.join(map(str, ingested)) or 'none'}); "
        f"{len(gaps)} ingest handovers, each gap the longest time with nothing stored "
        f"near the old loop's end: {', '.join(f'{g:g}' for g in gaps) or 'none'} s. The window's longest time "
        f"with nothing stored: {step['store_gap_max_s']} s; p99 lateness {step['p99_s']} s, "
        f"{step['published']:,} published, {step['early']} early.",
    ]
    return result
