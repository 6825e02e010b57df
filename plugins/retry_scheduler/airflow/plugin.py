"""Airflow plugin of kafka-retry-scheduler: the Dead letters page in the Airflow UI.

Registered under the ``airflow.plugins`` entry point of the package: installing the package is
enough, nothing is copied into the plugins folder.

The page and its JSON API (``retry_scheduler.airflow.webui.app``) are served by the api-server at
``/retry-scheduler/``; the navigation entry sits in Airflow's *Browse* menu and shows the page
inside the Airflow UI.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin

from retry_scheduler.airflow.webui.app import PREFIX, app

URL_PREFIX = PREFIX
# With [api] base_url on a sub-path (https://host/airflow/), the UI must link to that sub-path.
_ROOT = urlsplit(conf.get("api", "base_url", fallback="") or "/").path.rstrip("/")


class RetrySchedulerPlugin(AirflowPlugin):
    """The Dead letters page (FastAPI app) and its entry in the Airflow navigation."""

    name = "retry_scheduler"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Dead letters"}]
    external_views = [
        {
            "name": "Dead letters",
            "href": f"{_ROOT}{URL_PREFIX}/",
            "destination": "nav",
            "category": "browse",
            "url_route": "dead-letters",
            "icon": f"{_ROOT}{URL_PREFIX}/static/icon.svg",
        }
    ]
