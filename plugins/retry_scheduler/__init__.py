"""kafka-retry-scheduler: delayed retries and dead letters for Kafka, orchestrated by Apache Airflow.

The SDK (:mod:`retry_scheduler.client`) needs only confluent-kafka. A policies module imports
:class:`Policy`, :class:`Backoff`, :class:`Destination` and :class:`Breaker` from here (``from
retry_scheduler import Backoff, Breaker, Destination, Policy``).
"""

from __future__ import annotations

import sys
from importlib import metadata
from typing import TYPE_CHECKING, Any

if sys.version_info < (3, 11):  # noqa: UP036 (a plugins folder or a stray interpreter can import it)
    raise ImportError(
        f"kafka-retry-scheduler needs Python 3.11 or newer; this is {sys.version.split()[0]} "
        f"({sys.executable})"
    )

if TYPE_CHECKING:
    from retry_scheduler.core.breakers import Breaker
    from retry_scheduler.core.declarations import Destination
    from retry_scheduler.core.policy import Backoff, Policy

try:
    __version__ = metadata.version("kafka-retry-scheduler")
except metadata.PackageNotFoundError:  # imported from a plugins folder, not installed
    __version__ = "0+unknown"

__all__ = ["Backoff", "Breaker", "Destination", "Policy", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazily, so that importing the SDK does not import the policy code.
    if name in ("Backoff", "Policy"):
        from retry_scheduler.core import policy

        return getattr(policy, name)
    if name == "Breaker":
        from retry_scheduler.core.breakers import Breaker

        return Breaker
    if name == "Destination":
        from retry_scheduler.core.declarations import Destination

        return Destination
    raise AttributeError(f"module 'retry_scheduler' has no attribute {name!r}")
