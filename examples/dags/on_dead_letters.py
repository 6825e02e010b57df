"""Example: a DAG that runs when dead letters appear on the DLQ topic.

Copy this file into your DAGs folder and adapt ``triage``. The asset's watcher runs in Airflow's
triggerer (``airflow triggerer`` must be running) and reads the DLQ topics with the Kafka connection
``retry_dlq_watch``, whose extra is the consumer configuration with a group of its own::

    airflow connections add retry_dlq_watch --conn-type kafka --conn-extra \
        '{"bootstrap.servers": "kafka:9092", "group.id": "retry-dlq-watch", "auto.offset.reset": "latest"}'

Each dead letter becomes an asset event; the scheduler starts a run for the events that arrived
since the last one, and ``triage`` receives them all. What the event carries: the DLQ topic,
partition and offset, the record's key, and its ``retry.*`` headers (``retry_id``, ``destination``,
``dead_reason``, ``reason``, ``error_class``, ``attempt``...), never its value.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pendulum
from airflow.sdk import dag, task

from retry_scheduler.airflow.dead_letters import dead_letters_asset

log = logging.getLogger(__name__)

#: The DLQ topics to watch: the policies' ``dlq_topic`` (``retry.dlq`` unless a policy names another).
DEAD_LETTERS = dead_letters_asset(os.environ.get("RETRY_DLQ_WATCH_TOPICS", "retry.dlq").split(","))


@dag(
    dag_id="on_dead_letters",
    schedule=[DEAD_LETTERS],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["retry-scheduler", "example"],
    doc_md=__doc__,
)
def on_dead_letters() -> None:
    @task
    def triage(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        """Here: open a ticket, page the owning team, or replay what is known to be transient."""
        letters = [event.extra["payload"] for event in triggering_asset_events[DEAD_LETTERS]]
        for letter in letters:
            log.warning(
                "dead letter %s for %s (%s): %s",
                letter["retry_id"],
                letter["destination"],
                letter["dead_reason"],
                letter["reason"],
            )
        return letters

    triage()


on_dead_letters()
