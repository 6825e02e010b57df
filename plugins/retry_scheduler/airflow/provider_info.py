"""What ``airflow providers list`` shows of this package (the ``apache_airflow_provider`` entry point)."""

from __future__ import annotations

from typing import Any

from retry_scheduler import __version__


def get_provider_info() -> dict[str, Any]:
    """The provider's description, as Airflow's providers manager reads it (its runtime schema).

    The Dead letters page and the DAG views are registered as an Airflow plugin by the
    ``airflow.plugins`` entry point (listed by ``airflow plugins``), not here: listed in both, Airflow
    would load the plugin twice and report the second as an import error.
    """
    return {
        "package-name": "kafka-retry-scheduler",
        "name": "Kafka retry scheduler",
        "description": "Delayed retries and dead letters for Kafka, run by Airflow, kept in PostgreSQL: "
        "the retry_scheduler DAGs, the Dead letters page, alert notifiers and the Spark bulk jobs.",
        "versions": [__version__],
        "hooks": [
            {
                "integration-name": "Kafka retry scheduler",
                "python-modules": ["retry_scheduler.airflow.hook"],
            }
        ],
        "operators": [
            {
                "integration-name": "Kafka retry scheduler",
                "python-modules": ["retry_scheduler.airflow.operators"],
            }
        ],
        "notifications": [
            "retry_scheduler.airflow.notifiers.WebhookNotifier",
            "retry_scheduler.airflow.notifiers.EmailNotifier",
            "retry_scheduler.airflow.notifiers.LogNotifier",
        ],
    }
