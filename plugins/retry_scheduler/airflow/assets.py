"""The service's Airflow Assets: what its DAGs produce that other DAGs can be scheduled on.

``retry_compaction`` updates :func:`archive_asset` each time a run has archived its day (the event's
``extra`` holds ``day`` and ``archive``, the archive's URI). A downstream DAG that loads the Parquet archive::

    from retry_scheduler.airflow.assets import archive_asset

    @dag(schedule=[archive_asset()], ...)
    def load_retry_archive(): ...
"""

from __future__ import annotations

from airflow.sdk import Asset

#: The name other DAGs refer to (``Asset.ref(name=ARCHIVE_ASSET)`` works too).
ARCHIVE_ASSET = "retry_scheduler_archive"


def archive_asset() -> Asset:
    """The Parquet archive of compacted jobs. Its identity is its name alone, not the archive's URI:
    Airflow keeps an asset's name and URI unique, so an archive moved to another ``RETRY_ARCHIVE_URI``
    would otherwise leave the DAG's outlet inactive. Each event's ``extra`` says where it is."""
    return Asset(name=ARCHIVE_ASSET, group="retry-scheduler")
