"""Deadline Alerts: a run of ``retry_compaction`` or ``retry_bulk_replay`` still going some time after
it was queued alerts through the same channels as a failure (built-in and declared).

Airflow's scheduler checks each run's deadline and, once it passed, hands :func:`deadline_missed` to
the executor (``SyncCallback``); on an Airflow without it (3.1), to the triggerer (``AsyncCallback``).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

from retry_scheduler.ops.alerts import deadline_alert_from_context

log = logging.getLogger(__name__)


def deadline_alert(after: timedelta) -> Any:
    """A ``DeadlineAlert``: alert when a run has not finished ``after`` its queueing."""
    from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference

    try:
        from airflow.sdk.definitions.callback import SyncCallback

        callback: Any = SyncCallback(deadline_missed)
    except ImportError:  # Airflow 3.1: callbacks run in the triggerer only
        from airflow.sdk.definitions.deadline import AsyncCallback

        callback = AsyncCallback(deadline_missed_async)
    return DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=after, callback=callback)


def deadline_missed(context: dict[str, Any] | None = None, **_: Any) -> None:
    """The callback: send the late run's alert to every channel. Raises when no channel that reaches a
    person took it (the callback then shows failed), never for a channel that is merely off."""
    from retry_scheduler.airflow.notifiers import builtin_notifiers, declared_channels
    from retry_scheduler.ops.monitor import announced

    alert = deadline_alert_from_context(context or {})
    channels = builtin_notifiers()
    try:
        channels += declared_channels()
    except Exception as exc:
        log.error("the declared alert channels cannot be read: %s: %s", type(exc).__name__, exc)
    results = [(channel, channel.send(alert)) for channel in channels]
    if not announced(results):
        raise RuntimeError(f"the deadline alert {alert.headline!r} reached no channel: see the errors above")


async def deadline_missed_async(context: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """:func:`deadline_missed` for the triggerer: the channels block, so they run in a thread."""
    await asyncio.to_thread(deadline_missed, context, **kwargs)
