"""The header protocol document's ``kcat`` examples, run as written with Debian's ``kcat``.

Only the broker's address and the topics' names are changed (``kafka:9092`` and ``retry``/``orders``
become the test broker's and this test's own topics); every flag and header is the document's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from retry_scheduler.core import protocol as p
from tests.integration.test_loop import new_loop
from tests.kafkautil import consume, create_topics

pytestmark = pytest.mark.integration

DOCS = Path(__file__).resolve().parents[2] / "docs" / "header-protocol.md"
ANCHOR = "From a shell, with `kcat`"


def docs_kcat_example() -> str:
    text = DOCS.read_text()
    at = text.find(ANCHOR)
    assert at >= 0, f"{DOCS} no longer has the paragraph {ANCHOR!r}"
    block = re.search(r"```bash\n(.*?)```", text[at:], re.S)
    assert block is not None, f"no ```bash block follows {ANCHOR!r}"
    return block.group(1)


def test_the_docs_kcat_examples_send_retries_that_come_back_where_they_say(
    database_url: str, bootstrap_servers: str, topic_prefix: str, tmp_path: Path
) -> None:
    kcat = shutil.which("kcat")
    assert kcat is not None, "the docs' kcat examples are run with Debian's kcat: apt-get install kcat"
    orders = f"{topic_prefix}-orders"
    loop = new_loop(
        database_url, bootstrap_servers, topic_prefix, destination_allowlist=rf"^{topic_prefix}-[a-z.-]+$"
    )
    create_topics(bootstrap_servers, [orders, loop.settings.retry_topic], partitions=1)
    script = (
        docs_kcat_example()
        .replace("kafka:9092", bootstrap_servers)
        .replace("-t retry ", f"-t {loop.settings.retry_topic} ")
        .replace("retry.destination=orders ", f"retry.destination={orders} ")
    )
    assert script.count(bootstrap_servers) == 2 and script.count(orders) == 2, script
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr

    counts = loop.ingest(2)
    assert counts.stored == 2 and counts.pending == 2, counts
    loop.publish(3)  # 1795660800000 is past: due at once
    redelivery = f"{orders}.orders-app.redelivery"
    seen = consume(bootstrap_servers, [orders, redelivery], expected=2)
    by_topic = {s.topic: s for s in seen}
    assert sorted(by_topic) == sorted([orders, redelivery]), seen
    for s in seen:
        assert (s.key, s.value) == (b"order-42", b'{"order": 42}')  # kcat -P splits on the newline
        assert s.header(p.ATTEMPT) == "1"
    # The failure the first example describes, kept with its job; the second's group, which chose the topic.
    jobs = {r["destination"]: r for r in loop.rows()}
    assert (jobs[orders]["reason"], jobs[orders]["error_class"]) == (
        "payment service timed out",
        "TimeoutError",
    )
    assert jobs[redelivery]["consumer_group"] == "orders-app"
    assert {r["due_at"].timestamp() for r in jobs.values()} == {1795660800.0}  # retry.at, as written
