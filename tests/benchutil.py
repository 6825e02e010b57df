"""Running one benchmark measurement in small, as the bench tests do."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from bench.measure import BenchOptions, Sizes, run_bench
from retry_scheduler.core.config import Settings
from tests.conftest import ADMIN_URL


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
