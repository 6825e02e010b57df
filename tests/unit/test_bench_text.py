"""The report's explanation of the PySpark figures, from the jobs' own step timings."""

from __future__ import annotations

from bench.slow import budget_text, phases_text


def test_the_budget_sentence_names_the_statements_against_the_target() -> None:
    bulk = {"marking_s": 13.46, "phases_s": {"select": 0.2, "read_produce_mark": 18.4}}
    compact = {"phases_s": {"read_and_count": 16.2, "delete": 7.36}}
    text = budget_text(1_000_000, bulk, compact)
    assert "would leave 10 s for 1,000,000 jobs" in text
    assert "mark them published kept PostgreSQL busy for 13.5 s" in text
    assert "the `DELETE`s of compaction took 7.4 s" in text
    assert phases_text(bulk) == "select 0.2, read produce mark 18.4"


def test_no_budget_sentence_without_the_step_timings() -> None:
    assert budget_text(1_000_000, {"marking_s": None, "phases_s": {}}, {}) == ""
    assert budget_text(1_000_000, {"marking_s": 3.0}, {"phases_s": {}}) == ""
    assert phases_text({}) == "n/a"
