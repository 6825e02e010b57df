"""What users read matches what the code does."""

from __future__ import annotations


def test_the_readme_lists_every_metric_the_loops_send() -> None:
    from retry_scheduler.core.metrics import METRICS
    from tests.conftest import ROOT

    # (the metrics section of the README, one table row per metric)
    readme = (ROOT / "README.md").read_text()
    assert [name for name in METRICS if f"| `{name}` |" not in readme] == []
