"""The service's Airflow Assets: what its DAGs produce that other DAGs can be scheduled on.

``retry_compaction`` updates :func:`archive_asset` each time a run has archived its day (the event's
``extra`` holds ``day`` and ``archive``, the archive's URI). A downstream DAG that loads the Parquet archive::

    from retry_scheduler.airflow.assets import archive_asset

    @dag(schedule=[archive_asset()], ...)
    def load_retry_archive(): ...

``dlq_window_replay`` and ``retry_bulk_replay`` update :func:`replays_asset` each time a run put dead
jobs back on their way (not for a dry run, nor a run that replayed nothing): the event's ``extra`` is
the run's audit record (:func:`replay_extra`): what it selected, how many it replayed, the filter.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset

#: The name other DAGs refer to (``Asset.ref(name=ARCHIVE_ASSET)`` works too).
ARCHIVE_ASSET = "retry_scheduler_archive"


def archive_asset() -> Asset:
    """The Parquet archive of compacted jobs. Its identity is its name alone, not the archive's URI:
    Airflow keeps an asset's name and URI unique, so an archive moved to another ``RETRY_ARCHIVE_URI``
    would otherwise leave the DAG's outlet inactive. Each event's ``extra`` says where it is."""
    return Asset(name=ARCHIVE_ASSET, group="retry-scheduler")


#: Updated by every replay run that replayed something (window or bulk).
REPLAYS_ASSET = "retry_scheduler_replays"


def replays_asset() -> Asset:
    """The dead jobs replayed by ``dlq_window_replay`` and ``retry_bulk_replay`` runs."""
    return Asset(name=REPLAYS_ASSET, group="retry-scheduler")


def replay_extra(dag_id: str, audit: dict[str, Any]) -> dict[str, Any]:
    """A replay run's asset event ``extra``, from its audit row (``ops.dlq.audit_of_run``)."""
    return {
        "dag_id": dag_id,
        "run_id": audit.get("run_id"),
        "action": audit.get("action"),
        "matched": audit.get("matched"),
        "replayed": audit.get("affected"),
        "filter": audit.get("filter") or {},
        "skipped": audit.get("skipped") or {},
        "audit_id": audit.get("id"),
    }
