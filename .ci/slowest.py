"""Print where the time of `make test` went, from the reports it wrote to .test-reports/: each part's
wall time, the test-minutes of each directory split into fixtures' setup, test bodies and teardown
with the CPU-minutes they used, the tests that used the most CPU (*.phases.json), and the slowest
tests (JUnit *.xml), slowest first."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def _parts(folder: Path) -> None:
    """Wall time of each part (the parallel and the serial run) and the test-minutes by directory."""
    for report in sorted(folder.glob("*.phases.json")):
        try:
            phases: dict[str, dict[str, float]] = json.loads(report.read_text())
        except (OSError, ValueError) as exc:
            print(f"{report}: unreadable ({exc})")
            continue
        part = report.name.removesuffix(".phases.json")
        wall = _wall_seconds(folder / f"{part}.xml")
        by_dir: dict[str, list[float]] = {}
        for nodeid, when in phases.items():
            directory = "/".join(nodeid.split("::")[0].split("/")[:2])
            row = by_dir.setdefault(directory, [0, 0.0, 0.0, 0.0, 0.0])
            row[0] += 1
            for n, phase in enumerate(("setup", "call", "teardown", "cpu"), start=1):
                row[n] += when.get(phase, 0.0)
        wall_text = f"{wall / 60:.1f} min of wall time, " if wall is not None else ""
        print(f"\n{part}: {wall_text}test-minutes by directory (setup = the fixtures' start-ups)")
        print(
            f"  {'directory':<20} {'tests':>5} {'setup':>7} {'call':>7} {'teardown':>8} {'all':>7} {'CPU':>7}"
        )
        for directory, (count, setup, call, teardown, cpu) in sorted(
            by_dir.items(), key=lambda kv: -sum(kv[1][1:4])
        ):
            total = setup + call + teardown
            print(
                f"  {directory:<20} {count:>5} {setup / 60:>7.1f} {call / 60:>7.1f} "
                f"{teardown / 60:>8.1f} {total / 60:>7.1f} {cpu / 60:>7.1f}"
            )
        heavy = sorted(((w.get("cpu", 0.0), nodeid) for nodeid, w in phases.items()), reverse=True)[:10]
        print(f"  the most CPU (minutes; a test's and the processes it waited for): {part}")
        for cpu, nodeid in heavy:
            print(f"  {cpu / 60:7.2f}  {nodeid}")


def _wall_seconds(junit: Path) -> float | None:
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return None
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return float(suite.get("time") or 0) if suite is not None else None


def main(folder: str = ".test-reports", count: int = 15) -> None:
    _parts(Path(folder))
    cases = []
    for report in sorted(Path(folder).glob("*.xml")):
        try:
            root = ET.parse(report).getroot()
        except ET.ParseError as exc:
            print(f"{report}: unreadable ({exc})")
            continue
        for case in root.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append((float(case.get("time") or 0), name))
    if not cases:
        print(f"no test reports in {folder}")
        return
    cases.sort(reverse=True)
    total = sum(t for t, _ in cases)
    print(
        f"\nthe {min(count, len(cases))} slowest of {len(cases)} tests ({total / 60:.1f} test-minutes in all):"
    )
    for seconds, name in cases[:count]:
        print(f"{seconds:8.1f} s  {name}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
