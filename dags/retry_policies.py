"""Retry policies of this deployment: reviewed like code, loaded by the retry scheduler.

Not a DAG file (listed in .airflowignore). ``POLICIES`` declares named policies,
``DESTINATIONS`` maps a destination topic to its policy; ``default`` applies otherwise.
Retries may go only to the destinations named here: those of ``DESTINATIONS`` and
``ALLOWED_DESTINATIONS`` (names, globs like ``"shop.*"``, or ``re.compile(...)``), plus what
``RETRY_DESTINATION_ALLOWLIST`` adds. Internal topics, the retry topics and the DLQ topics never.
"""

from __future__ import annotations

from retry_scheduler.core.breakers import Breaker
from retry_scheduler.core.policy import Backoff, Policy

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

DESTINATIONS = {
    "demo.orders": "demo",
}

#: The destinations of the README's examples and of the demo.
ALLOWED_DESTINATIONS = ["orders", "payments", "demo.*"]

#: The most records per second the service publishes to a destination (names or globs), retries and
#: replays alike; none by default. For example: RATE_LIMITS = {"payments": 200}
RATE_LIMITS: dict[str, float] = {}

#: A breaker per destination (names or globs): when the records sent to it fail or come back past a
#: share, its due jobs are held (attempts unspent) until a probe record stays away; none by default.
#: For example: BREAKERS = {"payments": Breaker(failure_rate=0.5, min_records=20, cool_down="30s")}
BREAKERS: dict[str, Breaker] = {}

#: Alert channels beyond the built-in webhook, e-mail and log: any Airflow notifier, rendered with the
#: alert in its context (README, "Add a Slack channel"). For example:
#:
#:     from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier
#:     ALERT_CHANNELS = [SlackWebhookNotifier(slack_webhook_conn_id="slack_ops", text="{{ alert.summary() }}")]
ALERT_CHANNELS: list = []
