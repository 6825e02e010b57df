"""Running one benchmark measurement in small, as the bench tests do."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from bench.measure import BenchOptions, Sizes, run_bench
from retry_scheduler.core.config import Settings
from tests.conftest import ADMIN_URL


def run_measurement(out: Path, bootstrap: str, name: str, sizes: Sizes) -> dict[str, Any]:
    """Run the measurement ``name`` alone (``--quick``, a throwaway database of its own) and return
    report.json; the measurement must not have been skipped."""
    options = BenchOptions(
        out=out,
        quick=True,
        only=(name,),
        sizes=sizes,
        db_name=f"retry_bench_{name.split('_')[0]}_{uuid.uuid4().hex[:8]}",
        bootstrap=bootstrap,
    )
    run_bench(Settings(database_url=ADMIN_URL), options, say=lambda _m: None)
    report = json.loads((out / "report.json").read_text())
    measurement = report["measurements"][name]
    assert measurement["skipped"] is None, measurement["skipped"]
    return report
