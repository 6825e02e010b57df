"""Retry policies of this deployment: reviewed like code, loaded by the retry scheduler.

Not a DAG file (listed in .airflowignore). ``POLICIES`` declares named policies; ``DESTINATIONS``
declares each destination once (a topic or a glob like ``"shop.*"``) with all that applies to it: its
policy (``default`` otherwise), a rate limit, a breaker. Retries may go only to the destinations
declared here, plus what ``RETRY_DESTINATION_ALLOWLIST`` adds; internal topics, the retry topics and
the DLQ topics never. ``retry-scheduler policies check`` prints each one's rules as they resolve.
"""

from __future__ import annotations

from retry_scheduler import Backoff, Destination, Policy

POLICIES = [
    Policy("default", delays=["10s", "1m", "5m", "30m"], max_attempts=4, max_age="7d"),
    Policy(
        "fast",
        backoff=Backoff(base="1s", factor=2, max="1m", jitter=0.1),
        max_attempts=5,
        max_age="1h",
        fatal_errors=["ValueError", "KeyError"],
    ),
    # The demo's policy: short enough to watch a record recover and another exhaust.
    Policy("demo", delays=["2s", "3s"], max_attempts=2, max_age="10m", fatal_errors=["SchemaError"]),
]

DESTINATIONS = [
    Destination("demo.orders", policy="demo"),
    Destination("demo.*"),  # the demo's other topics
    # The README's examples.
    Destination("orders"),
    Destination("payments"),
    # A destination whose consumer needs it gets a rate limit and a breaker, for example:
    # Destination("payments", rate_limit=200, breaker=Breaker(failure_rate=0.5, min_records=20, cool_down="30s"))
]

#: Alert channels beyond the built-in webhook, e-mail and log: any Airflow notifier, rendered with the
#: alert in its context (README, "Add a Slack channel"). For example:
#:
#:     from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier
#:     ALERT_CHANNELS = [SlackWebhookNotifier(slack_webhook_conn_id="slack_ops", text="{{ alert.summary() }}")]
ALERT_CHANNELS: list = []
