"""Print the slowest tests of the JUnit reports `make test` wrote (.test-reports/*.xml), slowest first."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def main(folder: str = ".test-reports", count: int = 15) -> None:
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
