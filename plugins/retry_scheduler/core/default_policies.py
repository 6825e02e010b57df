"""The policies used when a deployment declares none: only ``default`` (docs/guide/policies.md).

A deployment declares its own in ``retry_policies.py`` next to its DAGs (or where ``RETRY_POLICIES``
points); this module is what a fresh installation falls back to, so the service runs out of the box.
"""

from __future__ import annotations

from retry_scheduler.core.policy import Policy

POLICIES = [
    Policy("default", delays=["10s", "1m", "5m", "30m"], max_attempts=4, max_age="7d"),
]

DESTINATIONS: dict[str, str] = {}

#: Destinations are denied by default: a deployment lists its own (names, globs like "shop.*",
#: re.compile(...)) in its policies module, or sets RETRY_DESTINATION_ALLOWLIST.
ALLOWED_DESTINATIONS: list[str] = []
