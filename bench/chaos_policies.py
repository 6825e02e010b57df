"""Retry policies of the chaos runs (``retry-scheduler chaos``): short delays, one DLQ topic per trial.

Loaded by the ingest workers through ``RETRY_POLICIES``; each trial names its own DLQ topic in
``CHAOS_DLQ_TOPIC`` so that trials sharing a broker never see each other's dead records, and
allows only its destination (``CHAOS_DESTINATION``).
"""

from __future__ import annotations

import os

from retry_scheduler.core.breakers import Breaker
from retry_scheduler.core.policy import Backoff, Policy

DLQ_TOPIC = os.environ.get("CHAOS_DLQ_TOPIC", "chaos.dlq")
#: Each trial's one destination (``CHAOS_DESTINATION``): every other is refused.
ALLOWED_DESTINATIONS = [os.environ.get("CHAOS_DESTINATION", "chaos.orders")]

#: ``retry.attempt`` at or above this is dead (``exhausted``) under ``default``.
MAX_ATTEMPTS = 3
FATAL_ERROR = "ChaosFatalError"

POLICIES = [
    Policy(
        "default",
        delays=["1s", "2s"],
        max_attempts=MAX_ATTEMPTS,
        max_age="1h",
        fatal_errors=[FATAL_ERROR],
        dlq_topic=DLQ_TOPIC,
    ),
    Policy(
        "chaos-backoff",
        backoff=Backoff(base="500ms", factor=2, max="3s", jitter=0.3),
        max_attempts=MAX_ATTEMPTS,
        max_age="1h",
        fatal_errors=[FATAL_ERROR],
        dlq_topic=DLQ_TOPIC,
    ),
]

#: The breaker trials (bench/chaos/breaker.py) open the destination's breaker by hand, so that it holds
#: their jobs, and close it again: it never opens by itself in a trial (nothing comes back).
BREAKERS = {ALLOWED_DESTINATIONS[0]: Breaker(cool_down="1h")} if os.environ.get("CHAOS_BREAKER") else {}
