"""The Spark jobs' progress: Spark tasks done out of those started, read from the driver's status tracker.

While a job runs, a thread of its driver prints one line to stdout whenever the figure moves::

    PROGRESS bulk-retry: 12/40 Spark tasks

In an Airflow task log that line is the progress; ``retry-scheduler bulk-retry|compact`` reads it
from the job's output (:func:`parse`) and shows a bar in a terminal, the same lines elsewhere. The
total grows as the job starts stages (reading, publishing, writing, verifying), so the figure is
how far the stages started so far are, not a promise about the stages to come.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

_LINE = re.compile(r"^PROGRESS (?P<label>[\w.-]+): (?P<done>\d+)/(?P<total>\d+) Spark tasks$")


def line(label: str, done: int, total: int) -> str:
    return f"PROGRESS {label}: {done}/{total} Spark tasks"


def parse(text: str) -> tuple[str, int, int] | None:
    """``(label, done, total)`` of a progress line, else None."""
    match = _LINE.match(text.strip())
    if match is None:
        return None
    return match["label"], int(match["done"]), int(match["total"])


def _stage_figures(tracker: Any, before: set[int]) -> dict[int, tuple[int, int]]:
    """``{stage: (tasks done, tasks)}`` of every submitted stage of the jobs started since ``before``
    (the job ids known when the block began): finished stages count too, so a stage that starts and
    ends between two polls is not missed. A finished job's stages that ran no task were skipped (their
    shuffle output was already there) and are left out; a running job's stages all count."""
    figures: dict[int, tuple[int, int]] = {}
    jobs = set(tracker.getJobIdsForGroup(None)) | set(tracker.getActiveJobsIds())
    for job_id in sorted(jobs - before):
        job = tracker.getJobInfo(job_id)
        if job is None:
            continue
        for stage_id in job.stageIds:
            info = tracker.getStageInfo(stage_id)
            ran = info is not None and (info.numCompletedTasks or info.numActiveTasks)
            if info is not None and (ran or job.status == "RUNNING"):
                figures[stage_id] = (info.numCompletedTasks, info.numTasks)
    return figures


@contextmanager
def reporting(label: str, every_s: float = 1.0, stream: TextIO | None = None) -> Iterator[None]:
    """Print the progress of the Spark work done inside the block (whichever SparkContext is active),
    and a last line with every task of the block's stages done, if the block ends without an error."""
    from pyspark import SparkContext

    out = stream or sys.stdout
    stop = threading.Event()
    last: list[tuple[int, int]] = []
    stages: dict[int, tuple[int, int]] = {}
    context = SparkContext._active_spark_context
    before = set(context.statusTracker().getJobIdsForGroup(None)) if context is not None else set()

    def show(done: int, total: int) -> None:
        if total and (not last or last[-1] != (done, total)):
            last.append((done, total))
            print(line(label, done, total), file=out, flush=True)

    def scan() -> None:
        context = SparkContext._active_spark_context
        if context is None:
            return
        try:
            stages.update(_stage_figures(context.statusTracker(), before))
        except Exception:  # the context stopping under us: the next poll, or the end, tells
            return

    def poll() -> None:
        while not stop.wait(every_s):
            scan()
            show(sum(d for d, _ in stages.values()), sum(t for _, t in stages.values()))

    thread = threading.Thread(target=poll, name="spark-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    scan()
    total = sum(t for _, t in stages.values())
    show(total, total)
