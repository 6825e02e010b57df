"""What users read matches what the code does."""

from __future__ import annotations


def test_the_docs_list_every_metric_the_loops_send() -> None:
    from retry_scheduler.core.metrics import METRICS
    from tests.conftest import ROOT

    # (the metrics section of the alerts page, one table row per metric)
    page = (ROOT / "docs" / "operations" / "alerts.md").read_text()
    assert [name for name in METRICS if f"| `{name}` |" not in page] == []


def test_the_header_reference_documents_every_header_the_code_reads() -> None:
    """``docs/header-protocol.md``: each ``retry.*`` header and each header read from another tool's
    dead-letter topic appears there as `name`, with examples in Python, Java and kcat."""
    from retry_scheduler.core import protocol
    from retry_scheduler.core.adopt import HEADERS, SPRING_RETRYABLE
    from tests.conftest import ROOT

    reference = (ROOT / "docs" / "header-protocol.md").read_text()
    read = set(protocol.KNOWN) | {
        name for names in [*HEADERS.values(), SPRING_RETRYABLE] for name in names.values()
    }
    assert len(read) > len(protocol.KNOWN)  # the adopted formats' headers are in
    assert sorted(name for name in read if f"`{name}`" not in reference) == []
    assert all(example in reference for example in ("```python", "```java", "kcat -P"))


def test_the_docs_site_builds_strictly(tmp_path) -> None:
    """``mkdocs build --strict``: a link to a missing page or anchor, a page left out of the
    navigation, any warning fails (``make test`` runs this)."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import ROOT

    mkdocs = Path(sys.executable).parent / "mkdocs"
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()
    reference = (tmp_path / "site" / "configuration" / "index.html").read_text()
    assert "<code>RETRY_PUBLISH_BATCH</code>" in reference and "settings-reference" not in reference
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text()
    assert "Upgrade note" in changelog


def _slug(heading: str) -> str:
    """The anchor of a Markdown heading, as GitHub and mkdocs make it for these documents."""
    import re

    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def test_every_link_of_the_readme_and_every_repository_path_the_docs_name_exists() -> None:
    """The README is not part of the site: its links are checked here (files and anchors), and so
    are the repository paths the pages name in code spans (`bench/out/...`), which the site cannot link."""
    import re

    from tests.conftest import ROOT

    readme = (ROOT / "README.md").read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", readme):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else ROOT / "README.md"
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", file.read_text(), re.M)
            if anchor not in {_slug(h) for h in headings}:
                broken.append(target)
    assert broken == []
    named = set()
    for page in (ROOT / "docs").rglob("*.md"):
        named |= set(re.findall(r"`((?:bench|dags|tests|sql|include|examples)/[\w./-]+)`", page.read_text()))
    assert len(named) > 10
    assert sorted(p for p in named if not (ROOT / p).exists() and "*" not in p) == []


def test_the_configuration_reference_names_every_setting_the_code_reads() -> None:
    """Every ``RETRY_*`` / ``KAFKA_*`` variable in the package's code is in the reference: the
    generated table (``Settings.reference()``) or the page's own tables."""
    import re

    from retry_scheduler.core.config import Settings
    from tests.conftest import ROOT

    read = set()
    for path in (ROOT / "plugins" / "retry_scheduler").rglob("*.py"):
        read |= set(re.findall(r"\"((?:RETRY|KAFKA)_[A-Z_]+)\"", path.read_text()))
    page = (ROOT / "docs" / "configuration.md").read_text()
    generated = {name for name, _default, _doc in Settings.reference()}
    assert generated == Settings.env_names()  # every variable from_env reads has its row, and no more
    internal = {"RETRY_FAULT", "RETRY_TEST_STACK_SLOTS", "RETRY_TEST_STRICT_PROCESSES"}
    missing = sorted(n for n in read - generated - internal if f"`{n}`" not in page)
    assert missing == []


def test_the_newest_release_in_the_changelog_is_the_package_s_version() -> None:
    """``--version``, the wheel and the CHANGELOG agree: its first release heading is the version
    ``pyproject.toml`` builds (and what this checkout has installed), with an upgrade section."""
    import re
    import tomllib

    import retry_scheduler
    from tests.conftest import ROOT

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## (\S+) — ", changelog, re.M)
    assert releases[0] == version == retry_scheduler.__version__
    newest = changelog.split(f"## {releases[1]} — ")[0]
    assert "### Upgrading from" in newest and "Unreleased" not in changelog
