"""What users read matches what the code does."""

from __future__ import annotations


def test_the_readme_lists_every_metric_the_loops_send() -> None:
    from retry_scheduler.core.metrics import METRICS
    from tests.conftest import ROOT

    # (the metrics section of the README, one table row per metric)
    readme = (ROOT / "README.md").read_text()
    assert [name for name in METRICS if f"| `{name}` |" not in readme] == []


def test_the_header_reference_documents_every_header_the_code_reads() -> None:
    """``docs/header-protocol.md``: each ``retry.*`` header and each header read from another tool's
    dead-letter topic appears there as `name`, with examples in Python, Java and kcat."""
    from retry_scheduler.core import protocol
    from retry_scheduler.core.adopt import HEADERS
    from tests.conftest import ROOT

    reference = (ROOT / "docs" / "header-protocol.md").read_text()
    read = set(protocol.KNOWN) | {name for names in HEADERS.values() for name in names.values()}
    assert len(read) > len(protocol.KNOWN)  # the adopted formats' headers are in
    assert sorted(name for name in read if f"`{name}`" not in reference) == []
    assert all(example in reference for example in ("```python", "```java", "kcat -P"))
