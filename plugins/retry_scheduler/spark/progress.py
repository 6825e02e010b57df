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
from typing import TextIO

_LINE = re.compile(r"^PROGRESS (?P<label>[\w.-]+): (?P<done>\d+)/(?P<total>\d+) Spark tasks$")


def line(label: str, done: int, total: int) -> str:
    return f"PROGRESS {label}: {done}/{total} Spark tasks"


def parse(text: str) -> tuple[str, int, int] | None:
    """``(label, done, total)`` of a progress line, else None."""
    match = _LINE.match(text.strip())
    if match is None:
        return None
    return match["label"], int(match["done"]), int(match["total"])


@contextmanager
def reporting(label: str, every_s: float = 1.0, stream: TextIO | None = None) -> Iterator[None]:
    """Print the progress of the Spark work done inside the block (whichever SparkContext is active),
    and a last line with every task of the stages seen done, if the block ends without an error."""
    out = stream or sys.stdout
    stages: dict[int, tuple[int, int]] = {}
    stop = threading.Event()
    last: list[tuple[int, int]] = []

    def show(done: int, total: int) -> None:
        if total and (not last or last[-1] != (done, total)):
            last.append((done, total))
            print(line(label, done, total), file=out, flush=True)

    def poll() -> None:
        from pyspark import SparkContext

        while not stop.wait(every_s):
            context = SparkContext._active_spark_context
            if context is None:
                continue
            try:
                tracker = context.statusTracker()
                for stage_id in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(stage_id)
                    if info is not None:
                        stages[stage_id] = (info.numCompletedTasks, info.numTasks)
            except Exception:  # the context stopping under us: the next poll, or the end, tells
                continue
            show(sum(d for d, _ in stages.values()), sum(t for _, t in stages.values()))

    thread = threading.Thread(target=poll, name="spark-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    total = sum(t for _, t in stages.values())
    show(total, total)
