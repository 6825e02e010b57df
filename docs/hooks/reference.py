"""mkdocs hook: pages made from the code and the repository rather than written twice.

* ``<!-- settings-reference -->`` in a page becomes the table of every setting the service reads from
  the environment, from the settings' own definitions (``Settings.reference()``).
* ``changelog.md`` is the repository's ``CHANGELOG.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MARKER = "<!-- settings-reference -->"
ROOT = Path(__file__).resolve().parents[2]


def on_page_read_source(page: Any, config: Any) -> str | None:
    if page.file.src_uri == "changelog.md":
        return (ROOT / "CHANGELOG.md").read_text()
    return None


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from retry_scheduler.core.config import Settings

    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{name}` | {default} | {doc} |" for name, default, doc in Settings.reference()]
    return markdown.replace(MARKER, "\n".join(rows))
