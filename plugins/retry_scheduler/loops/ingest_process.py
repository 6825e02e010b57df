"""An ingest worker process, its own side: what :func:`~retry_scheduler.loops.ingest_worker.spawn_worker`
runs. It reads its work on stdin, ingests its share of the partitions and reports each batch's counts
on stdout (:func:`~retry_scheduler.loops.ingest_worker.run_workers` reads them)."""

from __future__ import annotations

import json
import logging
import pickle
import signal
import sys
import threading

from retry_scheduler.core.deployment import Deployment
from retry_scheduler.db.connection import database_lost
from retry_scheduler.db.store import Store
from retry_scheduler.loops.ingest import IngestCounts, Ingestor
from retry_scheduler.loops.ingest_worker import LOST_DATABASE_EXIT


def quiet_garbage_collector() -> None:
    """Keep Python's cycle collector off a worker's hot path. A batch holds thousands of records, each
    a message object with a list of header tuples: with the default thresholds (a collection every 700
    new containers) the collector ran again and again over the batch being built (a sixth of a
    worker's time, profiled). The objects a batch makes hold no cycles and are freed by reference
    counting; the modules loaded at start are set aside for good (``gc.freeze``), and a collection now
    runs every 50 000 new containers."""
    import gc

    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def worker_main() -> None:
    """An ingest worker process: reads its settings, policies and share of the partitions (pickled) on
    stdin, ingests them, writes each batch's counts as a JSON line on stdout, and stops after the batch
    in hand when stdin ends (its loop stopped it, or died)."""
    try:
        settings, registry, share, name = pickle.load(sys.stdin.buffer)
    except EOFError:  # started ahead of a handover that did not come to it: nothing to do
        return
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    stop = threading.Event()

    def watch_input() -> None:
        sys.stdin.buffer.read()  # returns at end of input
        stop.set()

    threading.Thread(target=watch_input, name="stdin", daemon=True).start()
    # A task ended with SIGTERM signals its whole process group: a worker stops as at end of input.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())

    def report(counts: IngestCounts) -> None:
        sys.stdout.write(json.dumps(counts.as_dict()) + "\n")
        sys.stdout.flush()

    quiet_garbage_collector()
    try:
        with Store(settings.database_url) as store:
            ingestor = Ingestor(Deployment(settings, registry), store, share=share)
            try:
                ingestor.pipeline(lambda: not stop.is_set(), report)
            finally:
                ingestor.close()
    except Exception as exc:
        if not database_lost(exc):
            raise
        logging.getLogger(__name__).warning("lost the database: %s: %s", type(exc).__name__, exc)
        sys.exit(LOST_DATABASE_EXIT)
