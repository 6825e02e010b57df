"""Sums up ``make chaos-ordered``: the model-based test of ordered mode over many seeds
(``tests/integration/test_ordered_model.py``), one JSON line per run, into ``ordered_violations``
over the keys, records and faults of all runs; written to SUMMARY.json and, as its ``ordered`` entry,
into ``chaos.json`` beside it (``make chaos`` keeps that entry).

Usage: ``python -m bench.chaos_ordered RUNS.jsonl SUMMARY.json [ENTRY]``: ENTRY is ``ordered`` (the
default) or ``ordered_cluster`` (``make chaos-ordered CLUSTER=1``, the runs on a Kafka cluster).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def _run(line: dict) -> str:
    """A run's name: its seed and its rebalance protocol (``12/consumer``)."""
    return f"{line['seed']}/{line.get('protocol', 'classic')}"


def summarize(lines: list[dict]) -> dict:
    faults: Counter[str] = Counter()
    for line in lines:
        faults.update(line["faults"])
    return {
        "runs": len(lines),
        "seeds": sorted({line["seed"] for line in lines}),
        "runs_by_protocol": dict(Counter(line.get("protocol", "classic") for line in lines)),
        "unfinished": sorted(_run(line) for line in lines if not line["finished"]),
        "ordered_violations": sum(len(line["violations"]) for line in lines),
        "violations": {_run(line): line["violations"] for line in lines if line["violations"]},
        "keys": sum(line["keys"] for line in lines),
        "records": sum(line["records"] for line in lines),
        "steps": sum(line["steps"] for line in lines),
        "faults": sum(faults.values()),
        "faults_by_kind": dict(faults.most_common()),
    }


def main(argv: list[str]) -> int:
    runs, out = Path(argv[0]), Path(argv[1])
    entry = argv[2] if len(argv) > 2 else "ordered"
    lines = (
        [json.loads(text) for text in runs.read_text().splitlines() if text.strip()] if runs.exists() else []
    )
    summary = summarize(lines)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    chaos = out.parent / "chaos.json"
    try:
        report = json.loads(chaos.read_text()) if chaos.exists() else {}
    except ValueError:
        report = {}
    report[entry] = {k: v for k, v in summary.items() if k != "violations"} | {"seeds": summary["seeds"]}
    chaos.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"ordered mode{' on a cluster' if entry == 'ordered_cluster' else ''}: {summary['ordered_violations']} violations over {summary['runs']} runs, "
        f"{summary['keys']} keys, {summary['records']} records, {summary['faults']} faults "
        f"({len(summary['unfinished'])} unfinished): {out}"
    )
    return 1 if summary["ordered_violations"] or summary["unfinished"] or not lines else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
