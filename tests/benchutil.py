"""Running one benchmark measurement in small, as the bench tests do."""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.measure import BenchOptions, Sizes, run_bench
from retry_scheduler.core.config import Settings
from tests.conftest import ADMIN_URL


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """A folder ``make`` filled once for the whole test run, for a module whose tests only read what
    it wrote (a benchmark's report): under pytest-xdist the module's tests may be spread over
    several workers, and each would otherwise run the measurement again (minutes of CPU on two
    cores). The first worker makes it under a file lock; the others wait for it and read it. A
    ``make`` that raises leaves nothing behind: the next worker tries again, and fails as loudly."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above each worker's own
    folder, done = shared / f"once-{name}", shared / f"once-{name}.done"
    with open(shared / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            folder.mkdir(exist_ok=True)
            make(folder)
            done.touch()
    return folder


def run_measurement(out: Path, bootstrap: str, names: str | tuple[str, ...], sizes: Sizes) -> dict[str, Any]:
    """Run the measurement ``names`` (one, or several in one run on one shared dev stack) with
    ``--quick`` sizes and a throwaway database of its own, and return report.json; none of them may
    have been skipped."""
    only = (names,) if isinstance(names, str) else names
    options = BenchOptions(
        out=out,
        quick=True,
        only=only,
        sizes=sizes,
        db_name=f"retry_bench_{only[0].split('_')[0]}_{uuid.uuid4().hex[:8]}",
        bootstrap=bootstrap,
        share_stack=True,
    )
    run_bench(Settings(database_url=ADMIN_URL), options, say=lambda _m: None)
    report = json.loads((out / "report.json").read_text())
    for name in only:
        measurement = report["measurements"][name]
        assert measurement["skipped"] is None, (name, measurement["skipped"])
    return report
