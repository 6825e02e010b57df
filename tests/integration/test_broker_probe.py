"""``bench/broker_probe.py``: the embedded broker alone, its CPU per record over time (issue 28's
soak drift). A few seconds of it against a real private broker: it reports every window."""

from __future__ import annotations

import pytest

from bench import broker_probe

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("consumer", ["ours", "none"])
def test_the_probe_reports_the_broker_s_cpu_per_record_in_every_window(
    consumer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(broker_probe, "WINDOW_S", 1)
    result = broker_probe.probe(consumer, seconds=3, rate=1000)
    assert result["sent"] >= 2000
    assert (result["consumed"] > 0) is (consumer == "ours")
    windows = result["broker_core_ms_per_1000_by_30s"]
    assert len(windows) == 3 and all(w >= 0 for w in windows) and any(w > 0 for w in windows)
