"""store_gaps: the ingest's longest times with nothing stored, at each handover and in the whole window;
what the ingest loops said they read."""

from __future__ import annotations

from pathlib import Path

from bench.timeline import store_gaps


def _steady(start: float, end: float, every: float = 0.1) -> list[float]:
    return [round(start + n * every, 3) for n in range(int((end - start) / every) + 1)]


def test_the_gap_at_each_handover_and_the_widest_in_the_window() -> None:
    # Stored every 0.1 s from 0 to 200 s, except 60.0-60.8 (a 0.8 s handover) and 120.0-123.0 (3 s).
    stored = [t for t in _steady(0, 200) if not 60.0 < t < 60.8 and not 120.0 < t < 123.0]
    gaps = store_gaps(stored, [61.5, 119.0])
    assert gaps["handover_gaps_s"] == [0.8, 3.0]
    assert (gaps["handover_gap_p50_s"], gaps["handover_gap_max_s"]) == (1.9, 3.0)
    assert (gaps["store_gap_max_s"], gaps["store_gap_max_at"]) == (3.0, 120.0)


def test_a_handover_far_from_any_gap_shows_the_steady_spacing() -> None:
    gaps = store_gaps(_steady(0, 100, every=0.25), [50.0])
    assert gaps["handover_gaps_s"] == [0.25]


def test_handovers_outside_the_stored_span_are_not_gaps() -> None:
    # The window's first loop started before the traffic; one ended after the last record was stored.
    gaps = store_gaps(_steady(10, 70), [5.0, 75.0])
    assert gaps["handover_gaps_s"] == [] and gaps["handover_gap_p50_s"] is None
    assert gaps["handover_gap_max_s"] is None and gaps["store_gap_max_s"] == 0.1


def test_nothing_stored() -> None:
    gaps = store_gaps([], [30.0])
    assert gaps == {
        "handover_gaps_s": [],
        "handover_gap_p50_s": None,
        "handover_gap_max_s": None,
        "store_gap_max_s": None,
        "store_gap_max_at": None,
    }


def test_the_partitions_each_ingest_loop_said_it_shared(tmp_path: Path) -> None:
    from bench.handover import partitions_ingested

    for run, said in (("run_id=a", "ingesting 42 partitions in 2 worker processes"), ("run_id=b", "other")):
        log = tmp_path / "dag_id=retry_scheduler" / run / "task_id=ingest" / "attempt=1.log"
        log.parent.mkdir(parents=True)
        log.write_text(f'{{"event":"{said}","logger":"retry_scheduler.loops.ingest"}}\n')
    publish = tmp_path / "dag_id=retry_scheduler" / "run_id=a" / "task_id=publish" / "attempt=1.log"
    publish.parent.mkdir(parents=True)
    publish.write_text("ingesting 7 partitions in 2 worker processes\n")  # not an ingest task's log
    assert partitions_ingested(tmp_path) == [42]
