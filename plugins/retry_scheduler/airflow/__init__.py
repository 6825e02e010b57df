"""Everything Airflow: the hook for the service's connections, task bodies, DAG factories, notifiers, plugin, page.

Needs Airflow 3.1 or newer (below 4): checked here, so that an older Airflow says so in one line
instead of failing somewhere inside a DAG file or the plugin.
"""

from __future__ import annotations

import re
from importlib import metadata

#: The Airflow versions this package supports (as the wheel's ``airflow`` extra pins them).
SUPPORTED_AIRFLOW = ((3, 1), (4, 0))


def _major_minor(version: str) -> tuple[int, int]:
    found = re.match(r"(\d+)(?:\.(\d+))?", version)
    return (int(found.group(1)), int(found.group(2) or 0)) if found else (0, 0)


try:
    _airflow = metadata.version("apache-airflow")
except metadata.PackageNotFoundError:  # Airflow run from a source tree: nothing to check against
    _airflow = ""
if _airflow and not SUPPORTED_AIRFLOW[0] <= _major_minor(_airflow) < SUPPORTED_AIRFLOW[1]:
    raise ImportError(
        f"kafka-retry-scheduler needs Apache Airflow >= 3.1 and < 4; this environment has {_airflow}: "
        "upgrade Airflow, or install the package where Airflow 3 runs"
    )
