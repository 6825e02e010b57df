"""Where the ingest benchmark starts its clock: never after the last row, so the rate always has rows."""

from __future__ import annotations

from bench.measure import timed_from

LOOP_BEGAN = (100.0, 500, 3)


def test_the_clock_starts_at_the_loops_first_report_when_rows_follow_it() -> None:
    assert timed_from(LOOP_BEGAN, (101.5, 1_500, 4), 500_500) == (101.5, 1_500, 4)


def test_a_first_report_holding_every_row_times_the_whole_loop() -> None:
    # The CI failure this guards: a quick run stored whole by the first reported batches gave
    # 0 rows in the timed window, so no rate and a division by zero in the report's text.
    assert timed_from(LOOP_BEGAN, (100.6, 2_500, 5), 2_500) == LOOP_BEGAN


def test_no_report_at_all_times_the_whole_loop() -> None:
    assert timed_from(LOOP_BEGAN, None, 2_500) == LOOP_BEGAN
