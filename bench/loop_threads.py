"""The scheduler's loops run in threads of this process, as the DAG's tasks run them: for the
benchmarks that measure the loops without Airflow, and the tests that run them beside a consumer."""

from __future__ import annotations

import threading

from retry_scheduler.core.config import Settings
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.policy import PolicyRegistry
from retry_scheduler.db.store import Store
from retry_scheduler.loops.ingest import Ingestor
from retry_scheduler.loops.publish import Publisher


class LoopThreads:
    """The scheduler's ingest and publish loops, each in a thread as the DAG's tasks run them, for
    ``seconds`` or until :meth:`close` (the benchmarks', and tests that run the loops beside a consumer).
    ``publish_settings``: the publisher's, when they differ (a shorter poll interval, say)."""

    def __init__(
        self,
        settings: Settings,
        registry: PolicyRegistry,
        seconds: float = 3600,
        publish_settings: Settings | None = None,
    ) -> None:
        self.stop = threading.Event()
        self._settings, self._registry, self._seconds = settings, registry, seconds
        self._publish_settings = publish_settings or settings
        self.threads = [
            threading.Thread(target=self._ingest, name="loop-ingest", daemon=True),
            threading.Thread(target=self._publish, name="loop-publish", daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _ingest(self) -> None:
        with Store(self._settings.database_url) as store:
            ingestor = Ingestor(Deployment(self._settings, self._registry), store)
            try:
                ingestor.run(self._seconds, self.stop.is_set)
            finally:
                ingestor.close()

    def _publish(self) -> None:
        with Store(self._publish_settings.database_url) as store:
            publisher = Publisher(Deployment.load(self._publish_settings), store)
            try:
                publisher.run(self._seconds, self.stop.is_set)
            finally:
                publisher.close()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
