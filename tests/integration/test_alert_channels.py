"""Any Airflow notifier as an alert channel: the Slack provider's ``SlackWebhookNotifier`` against a local
HTTP receiver, the SMTP provider's ``SmtpNotifier`` against a local SMTP server, both declared in the
policies module (``ALERT_CHANNELS``) or through ``RETRY_ALERT_CHANNELS``, carrying retry_monitor's alerts."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest

from bench.jobs import insert_jobs
from retry_scheduler.airflow.notifiers import (
    AlertConfigError,
    NotifierChannel,
    alert_notifiers,
    declared_channels,
)
from retry_scheduler.core.jobs import Status
from retry_scheduler.db.store import Store
from retry_scheduler.ops.alerts import Alert
from retry_scheduler.ops.monitor import Thresholds, run_monitor
from tests.integration.test_monitor import SmtpSink, WebhookReceiver, make_job
from tests.integration.test_monitor import smtp_server as smtp_server  # the fixture

pytestmark = pytest.mark.integration

SLACK_POLICIES = """
from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier
from retry_scheduler.core.policy import Policy

POLICIES = [Policy("default", delays=["10s"], max_attempts=2)]
ALERT_CHANNELS = [
    SlackWebhookNotifier(slack_webhook_conn_id="slack_ops", text="{{ alert.summary() }}"),
]
"""


@pytest.fixture
def slack(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A local receiver playing Slack's incoming webhook, as the connection ``slack_ops``, and a
    policies module declaring a ``SlackWebhookNotifier`` on it."""
    receiver = WebhookReceiver()
    # the Slack provider's way: the webhook URL in the password
    monkeypatch.setenv(
        "AIRFLOW_CONN_SLACK_OPS",
        json.dumps(
            {"conn_type": "slackwebhook", "password": receiver.url.replace("/hook", "/services/T0/B0/x")}
        ),
    )
    policies = tmp_path / "retry_policies.py"
    policies.write_text(SLACK_POLICIES)
    monkeypatch.setenv("RETRY_POLICIES", str(policies))
    yield receiver
    receiver.close()


def test_a_slack_notifier_declared_next_to_the_policies_carries_each_alert(
    database_url: str, slack: WebhookReceiver
) -> None:
    with Store(database_url) as store:
        insert_jobs(store, [make_job(1, due_s_ago=120, destination="payments")])

    fired = run_monitor(database_url, Thresholds(), alert_notifiers())
    again = run_monitor(database_url, Thresholds(), alert_notifiers())
    with psycopg.connect(database_url, autocommit=True) as conn:  # the backlog is gone: back to normal
        conn.execute("UPDATE retry_jobs SET due_at = now() + interval '1 hour'")
    resolved = run_monitor(database_url, Thresholds(), alert_notifiers())

    posts = slack.delivered()
    assert [p["path"] for p in slack.posts] == ["/services/T0/B0/x", "/services/T0/B0/x"]
    # the Slack provider's body: the rendered text, for each alert anew (not the first alert twice)
    assert posts[0]["text"].startswith("[FIRING] retry_monitor: oldest overdue job is 12")
    assert "Job " in posts[0]["text"] and "for payments is" in posts[0]["text"]
    assert posts[1]["text"].startswith("[RESOLVED] retry_monitor: oldest_overdue back to normal")
    assert fired["alerts"][0]["channels"] == {
        "webhook": None,
        "e-mail": None,
        "log": True,
        "SlackWebhookNotifier": True,
    }
    assert again["alerts"] == []
    assert [a["severity"] for a in resolved["alerts"]] == ["resolved"]


def test_a_failing_declared_channel_is_not_an_announcement_and_is_tried_again(
    database_url: str, slack: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    slack.status = 500
    with Store(database_url) as store:
        insert_jobs(store, [make_job(1, due_s_ago=120)])

    with caplog.at_level(logging.ERROR, logger="retry_scheduler.airflow.notifiers"):
        refused = run_monitor(database_url, Thresholds(), alert_notifiers())
    slack.status = 200
    retried = run_monitor(database_url, Thresholds(), alert_notifiers())

    assert refused["alerts"][0]["channels"]["SlackWebhookNotifier"] is False
    assert refused["alerts"][0]["delivered"] is False  # the log took it, but nobody was told
    assert "SlackWebhookNotifier alert '[FIRING] retry_monitor: oldest overdue job is" in caplog.text
    assert "not delivered" in caplog.text
    assert retried["alerts"][0]["delivered"] is True
    assert len(slack.delivered()) == 1


def test_the_smtp_provider_s_notifier_renders_the_alert_into_its_mail(
    database_url: str, smtp_server: SmtpSink, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    policies = tmp_path / "retry_policies.py"
    policies.write_text(
        textwrap.dedent(
            """
            from airflow.providers.smtp.notifications.smtp import SmtpNotifier
            from retry_scheduler.core.policy import Policy

            POLICIES = [Policy("default", delays=["10s"], max_attempts=2)]
            ALERT_CHANNELS = [
                SmtpNotifier(
                    to="oncall@example.com",
                    from_email="retries@example.com",
                    subject="{{ alert.headline }}",
                    html_content="{{ alert.email_html() }}",
                ),
            ]
            """
        )
    )
    monkeypatch.setenv("RETRY_POLICIES", str(policies))
    with Store(database_url) as store:
        insert_jobs(store, [make_job(10 + n, status=Status.DEAD, destination="payments") for n in range(3)])

    result = run_monitor(database_url, Thresholds(dead_per_hour=2), alert_notifiers())

    [(recipients, message)] = smtp_server.messages
    assert recipients == ["oncall@example.com"]
    assert (
        str(message["Subject"]) == "[FIRING] retry_monitor: 3 jobs went dead in the last hour (threshold 2)"
    )
    body = next(p for p in message.walk() if p.get_content_type() == "text/html").get_payload(decode=True)
    assert "Dead jobs by destination: payments 3." in body.decode()  # type: ignore[union-attr]
    assert result["alerts"][0]["channels"]["SmtpNotifier"] is True


def test_the_setting_names_a_list_of_notifiers_in_an_importable_module(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "ops_channels.py").write_text(
        "from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier\n"
        "CHANNELS = [SlackWebhookNotifier(slack_webhook_conn_id='s', text='{{ alert.text }}'),\n"
        "            SlackWebhookNotifier(slack_webhook_conn_id='pager', text='{{ alert.headline }}')]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ops_channels", raising=False)

    channels = declared_channels({"RETRY_ALERT_CHANNELS": "ops_channels:CHANNELS"})

    assert all(isinstance(channel, NotifierChannel) for channel in channels)
    # each its own name in the monitor's results
    assert [c.kind for c in channels] == ["SlackWebhookNotifier", "SlackWebhookNotifier#2"]
    with pytest.raises(AlertConfigError, match=r"RETRY_ALERT_CHANNELS='ops_channels': name a list as"):
        declared_channels({"RETRY_ALERT_CHANNELS": "ops_channels"})
    with pytest.raises(
        AlertConfigError, match=r"AttributeError: module 'ops_channels' has no attribute 'NOPE'"
    ):
        declared_channels({"RETRY_ALERT_CHANNELS": "ops_channels:NOPE"})


def test_an_entry_that_is_not_a_notifier_is_refused_by_its_place(tmp_path: Path) -> None:
    policies = tmp_path / "retry_policies.py"
    policies.write_text(
        "from retry_scheduler.core.policy import Policy\n"
        "POLICIES = [Policy('default', delays=['10s'], max_attempts=2)]\n"
        "ALERT_CHANNELS = ['https://hooks.slack.com/services/T/B/secret']\n"
    )

    with pytest.raises(AlertConfigError) as refused:
        declared_channels({"RETRY_POLICIES": str(policies)})

    assert str(refused.value).startswith(
        f"{policies}: ALERT_CHANNELS[0] is str, not a notifier: list notifier"
    )


def test_a_notifier_raising_is_a_failed_delivery_never_an_exception(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def notify(self, context: object) -> None:
            raise ConnectionError("slack.com unreachable")

    alert = Alert(title="t", text="x", severity="firing")
    with caplog.at_level(logging.ERROR, logger="retry_scheduler.airflow.notifiers"):
        delivered = NotifierChannel(Broken(), name="pager").send(alert)

    assert delivered is False
    assert "pager alert '[FIRING] t' not delivered: ConnectionError: slack.com unreachable" in caplog.text
