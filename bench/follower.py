"""A consumer following a destination live, as the application retries go back to does.

Every window of a fixed rate under the scheduler (:func:`bench.capacity._step`: the capacity steps,
the held snapshot's windows, the soak, the handover) runs one beside the service: the broker then serves the fetches real applications make (its CPU and memory
per 1 000 retries include them), and lateness is also seen where the application sees it: the time
a record reaches the consumer less its due time, from the ``bench.due-ms`` header the workload's
producer sets (the service passes headers it does not know through to the destination).
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from array import array
from typing import Any

from bench.timeline import percentile

#: The header the workload's producers set to each record's due time (epoch ms).
DUE_HEADER = "bench.due-ms"


class Follower:
    """Reads ``topic`` from its start in a thread of its own until stopped, and keeps, for each record
    with a ``DUE_HEADER``, when it arrived less when it was due."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer

        self.topic = topic
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-follower-{uuid.uuid4().hex[:8]}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        self.lateness = array("d")
        self.received = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"bench-follower-{topic}", daemon=True)

    def __enter__(self) -> Follower:
        self.consumer.subscribe([self.topic])
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()

    def _run(self) -> None:
        due_header = DUE_HEADER
        while not self._stop.is_set():
            messages = self.consumer.consume(10_000, 0.1)
            now = time.time()
            for msg in messages:
                if msg.error() is not None:
                    continue
                self.received += 1
                headers: list[tuple[str, bytes | None]] = msg.headers() or []  # type: ignore[assignment]
                for name, value in headers:
                    if name == due_header and value:
                        self.lateness.append(now - int(value) / 1000)
                        break

    def wait_for(self, records: int, timeout_s: float) -> None:
        """Wait until ``records`` have arrived, ``timeout_s`` at most (the service's acknowledgement
        comes before a consumer's fetch)."""
        deadline = time.monotonic() + timeout_s
        while self.received < records and time.monotonic() < deadline:
            time.sleep(0.2)

    def figures(self) -> dict[str, Any]:
        """What the consumer saw so far: records received, and the p50, p99 and worst of arrival less due
        time (``at_consumer_*``), with how many arrived before they were due."""
        samples = sorted(self.lateness)
        if not samples:
            return {"at_consumer_received": self.received}
        return {
            "at_consumer_received": self.received,
            "at_consumer_p50_s": round(statistics.median(samples), 4),
            "at_consumer_p99_s": round(percentile(samples, 0.99), 4),
            "at_consumer_max_s": round(samples[-1], 4),
            "at_consumer_early": sum(1 for s in samples if s < 0),
        }
