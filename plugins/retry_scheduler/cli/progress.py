"""Progress of long command-line operations: a bar in a terminal, plain lines anywhere else.

In a terminal (stderr is a TTY) a ``rich`` bar shows done/total, rate and time left; piped or in a
log (CI, cron, Airflow) each step is one line ``ACTION: DONE/TOTAL`` on stderr, so scripts and logs
see the same progress without control characters. Results still go to stdout.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

Report = Callable[[int, int], None]


@contextmanager
def progress(label: str, unit: str = "jobs", stream: TextIO | None = None) -> Iterator[Report]:
    """Yield ``report(done, total)`` that shows how far ``label`` got."""
    out = stream or sys.stderr
    if not out.isatty():

        def line(done: int, total: int) -> None:
            print(f"{label}: {done:,}/{total:,} {unit}", file=out, flush=True)

        yield line
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TextColumn("elapsed,"),
        TimeRemainingColumn(),
        TextColumn("left"),
        console=Console(file=out),
        # Results printed while the bar runs still go to stdout (a pipe, a file), not to the terminal;
        # lines written to stderr (a job's log) go above the bar.
        redirect_stdout=False,
    )
    task = bar.add_task(label, total=None)
    with bar:

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update
