"""Handover between overlapping loops: a loop whose time is up keeps going until relieved.

Airflow starts each ``retry_scheduler`` run a little late, sometimes very late (a retried task,
a busy scheduler). Rather than trusting the overlap of runs, every ingest and publish loop
heartbeats in ``retry_loops``; when its time is up it stops only once a newer loop of its kind
is alive, or when its grace period is over (so a stopped DAG does not leave it running forever).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from datetime import datetime

import psycopg

from retry_scheduler.db.connection import database_lost
from retry_scheduler.db.loop_records import LoopRecords

log = logging.getLogger(__name__)

#: A loop whose heartbeat is older than this is not alive.
ALIVE_S = 5.0
BEAT_EVERY_S = 1.0


def new_worker_id(kind: str) -> str:
    return f"{kind}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class LoopTenure:
    """The time a loop should run: ``duration_s``, extended by up to ``grace_s`` until relieved."""

    def __init__(self, records: LoopRecords, kind: str, duration_s: float, grace_s: float) -> None:
        self.records, self.kind = records, kind
        self.worker = new_worker_id(kind)
        self.deadline = time.monotonic() + duration_s
        self.hard_deadline = self.deadline + grace_s
        self._beat_at = 0.0
        self.started_at: datetime = records.heartbeat(self.worker, kind)
        self._extended = False

    def beat(self) -> None:
        """Heartbeat, at most once a second."""
        if time.monotonic() - self._beat_at >= BEAT_EVERY_S:
            self._beat_at = time.monotonic()
            self.records.heartbeat(self.worker, self.kind)

    def remaining_s(self) -> float:
        return max(0.0, self.hard_deadline - time.monotonic())

    def go_on(self) -> bool:
        """True while the loop should keep running."""
        now = time.monotonic()
        if now >= self.hard_deadline:
            if self._extended:
                log.warning("%s loop: no newer loop took over within the grace period; stopping", self.kind)
            return False
        self.beat()
        if now < self.deadline:
            return True
        if self.records.relieved(self.worker, self.kind, self.started_at, ALIVE_S):
            if self._extended:
                log.info("%s loop: relieved by a newer loop", self.kind)
            return False
        if not self._extended:
            self._extended = True
            log.info("%s loop: time is up but no newer loop is alive yet; carrying on", self.kind)
        return True

    def finish(self) -> None:
        """Record that this loop ended (a newer one need not wait for it). A loop ending because its
        database went away records nothing: its heartbeat stops, which says the same after ``ALIVE_S``."""
        try:
            self.records.finish(self.worker)
        except psycopg.Error as exc:
            if not database_lost(exc):
                raise
