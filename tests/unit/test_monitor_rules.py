"""retry_monitor's decisions (pure, frozen clock), its thresholds, and how alerts are shaped and addressed."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from retry_scheduler.airflow.notifiers import (
    Alert,
    AlertConfigError,
    EmailNotifier,
    LogNotifier,
    WebhookNotifier,
    alert_from_context,
    email_recipients,
    webhook_target,
)
from retry_scheduler.ops.monitor import (
    CHECKS,
    Incident,
    Reading,
    Thresholds,
    ThresholdsError,
    announced,
    evaluate,
)

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
EARLIER = NOW - timedelta(minutes=10)
QUIET = Reading(at=NOW, oldest_overdue_s=0.0, lateness_p99_s=0.01, published=50, dead_by_destination={})


def by_check(outcomes):
    return {o.check: o for o in outcomes}


# --- thresholds -------------------------------------------------------------------------------


def test_thresholds_default_without_the_variable() -> None:
    assert Thresholds.from_json(None) == Thresholds(
        oldest_overdue_s=60.0, lateness_p99_s=2.0, dead_per_hour=1000.0, interval_s=300
    )
    assert Thresholds.from_json("  ") == Thresholds()


def test_thresholds_variable_overrides_some_keys_and_null_turns_a_check_off() -> None:
    got = Thresholds.from_json('{"oldest_overdue_s": 120, "dead_per_hour": null, "interval_s": 600}')
    assert got == Thresholds(oldest_overdue_s=120.0, lateness_p99_s=2.0, dead_per_hour=None, interval_s=600)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{oldest_overdue_s: 1}", "retry_monitor_thresholds is not valid JSON"),
        ("[60]", "must be a JSON object"),
        ('{"oldest_overdue": 60}', "unknown key 'oldest_overdue'; the keys are oldest_overdue_s, "),
        ('{"lateness_p99_s": "2s"}', "'lateness_p99_s' must be a number >= 0, or null to turn the check off, not '2s'"),
        ('{"dead_per_hour": -1}', "'dead_per_hour' must be a number >= 0"),
        ('{"dead_per_hour": true}', "'dead_per_hour' must be a number >= 0"),
        ('{"interval_s": 0}', "'interval_s' must be a whole number of seconds above 0, not 0"),
        ('{"interval_s": 1.5}', "'interval_s' must be a whole number"),
        ('{"interval_s": null}', "'interval_s' must be a whole number"),
    ],
)  # fmt: skip
def test_bad_thresholds_variable_says_which_key_is_wrong(raw: str, message: str) -> None:
    with pytest.raises(ThresholdsError) as err:
        Thresholds.from_json(raw)
    assert message in str(err.value)


# --- evaluate: once per incident ----------------------------------------------------------------


def test_quiet_reading_alerts_nothing() -> None:
    outcomes = evaluate(QUIET, Thresholds(), {})
    assert [(o.check, o.transition, o.alert) for o in outcomes] == [(c, "ok", None) for c in CHECKS]


def test_a_new_incident_fires_once_with_the_figures() -> None:
    reading = Reading(
        at=NOW, oldest_overdue_s=125.4, oldest_overdue_job=17, oldest_overdue_destination="orders",
        lateness_p99_s=0.01, published=50,
    )  # fmt: skip
    overdue = by_check(evaluate(reading, Thresholds(), {}))["oldest_overdue"]
    assert overdue.transition == "new"
    assert overdue.since == NOW
    assert overdue.alert is not None
    assert overdue.alert.severity == "firing"
    assert overdue.alert.headline == (
        "[FIRING] retry_monitor: oldest overdue job is 125.4 s late (threshold 60 s)"
    )
    assert "Job 17 for orders is 125.4 s past its due time" in overdue.alert.text
    assert overdue.alert.fields["check"] == "oldest_overdue"
    assert (overdue.alert.fields["value"], overdue.alert.fields["threshold"]) == (125.4, 60.0)
    assert overdue.record(delivered=True) == {
        "check": "oldest_overdue", "firing": True, "since": NOW, "value": 125.4, "threshold": 60.0,
        "message": overdue.message, "notified": True, "resolved": False,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("state", "crossed", "transition", "severity", "firing_after"),
    [
        (Incident(), False, "ok", None, False),
        (Incident(), True, "new", "firing", True),
        (Incident(firing=True, since=EARLIER, announced=True), True, "ongoing", None, True),
        (Incident(firing=True, since=EARLIER, announced=False), True, "retry", "firing", True),
        (Incident(firing=True, since=EARLIER, announced=True), False, "resolved", "resolved", False),
        (Incident(firing=True, since=EARLIER, announced=False), False, "dropped", None, False),
    ],
)  # fmt: skip
def test_incident_transitions(
    state: Incident, crossed: bool, transition: str, severity: str | None, firing_after: bool
) -> None:
    reading = Reading(at=NOW, dead_by_destination={"orders": 1500 if crossed else 10})
    outcome = by_check(evaluate(reading, Thresholds(), {"dead_per_hour": state}))["dead_per_hour"]
    assert outcome.transition == transition
    assert (outcome.alert.severity if outcome.alert else None) == severity
    assert outcome.record(delivered=True)["firing"] is firing_after
    if state.firing:
        assert outcome.since == EARLIER  # an incident keeps its start


def test_resolved_alert_says_when_the_incident_started() -> None:
    state = Incident(firing=True, since=EARLIER, announced=True)
    outcome = by_check(evaluate(QUIET, Thresholds(), {"lateness_p99": state}))["lateness_p99"]
    assert outcome.alert is not None
    assert outcome.alert.headline.startswith("[RESOLVED] retry_monitor: lateness_p99 back to normal")
    assert f"The incident that started at {EARLIER.isoformat()} is over" in outcome.alert.text
    assert outcome.record(delivered=True) | {"message": None} == {
        "check": "lateness_p99", "firing": False, "since": EARLIER, "value": 0.01, "threshold": 2.0,
        "message": None, "notified": True, "resolved": True,
    }  # fmt: skip


def test_an_undelivered_resolution_keeps_the_incident_firing_for_the_next_run() -> None:
    state = Incident(firing=True, since=EARLIER, announced=True)
    outcome = by_check(evaluate(QUIET, Thresholds(), {"lateness_p99": state}))["lateness_p99"]
    assert outcome.record(delivered=False) | {"message": None} == {
        "check": "lateness_p99", "firing": True, "since": EARLIER, "value": 0.01, "threshold": 2.0,
        "message": None, "notified": False, "resolved": False,
    }  # fmt: skip


def test_an_undelivered_new_incident_is_recorded_firing_but_not_announced() -> None:
    reading = Reading(at=NOW, oldest_overdue_s=90.0, oldest_overdue_job=1, oldest_overdue_destination="o")
    record = by_check(evaluate(reading, Thresholds(), {}))["oldest_overdue"].record(delivered=False)
    assert (record["firing"], record["notified"], record["since"]) == (True, False, NOW)


@pytest.mark.parametrize(
    ("value", "fires"),
    [(60.0, False), (60.001, True)],
)
def test_a_check_fires_above_its_threshold_not_at_it(value: float, fires: bool) -> None:
    reading = Reading(at=NOW, oldest_overdue_s=value, oldest_overdue_job=1, oldest_overdue_destination="o")
    assert (by_check(evaluate(reading, Thresholds(), {}))["oldest_overdue"].alert is not None) is fires


def test_lateness_without_publications_is_not_judged() -> None:
    reading = Reading(at=NOW, lateness_p99_s=None, published=0)
    assert by_check(evaluate(reading, Thresholds(lateness_p99_s=0.0), {}))["lateness_p99"].transition == "ok"


def test_a_check_turned_off_never_fires() -> None:
    reading = Reading(at=NOW, dead_by_destination={"orders": 10**6})
    outcome = by_check(evaluate(reading, Thresholds(dead_per_hour=None), {}))["dead_per_hour"]
    assert (outcome.transition, outcome.alert) == ("ok", None)
    assert "check off" in outcome.message


def test_dead_alert_names_the_busiest_destinations() -> None:
    reading = Reading(at=NOW, dead_by_destination={"payments": 300, "orders": 1200, "audit": 1})
    alert = by_check(evaluate(reading, Thresholds(), {}))["dead_per_hour"].alert
    assert alert is not None
    assert alert.headline == "[FIRING] retry_monitor: 1501 jobs went dead in the last hour (threshold 1000)"
    assert "Dead jobs by destination: orders 1200, payments 300, audit 1." in alert.text


# --- which deliveries announce an incident ----------------------------------------------------------


@pytest.mark.parametrize(
    ("webhook", "email", "expected"),
    [
        (True, None, True),  # the webhook took it
        (False, True, True),  # one person-facing channel is enough
        (False, None, False),  # the only configured channel failed: try again next run
        (False, False, False),
        (None, None, True),  # no channel configured: the log is all there is
    ],
)
def test_announced_needs_a_person_facing_channel_when_one_is_configured(
    webhook: bool | None, email: bool | None, expected: bool
) -> None:
    results = [(WebhookNotifier(), webhook), (EmailNotifier(), email), (LogNotifier(), True)]
    assert announced(results) is expected


# --- alert shapes and connection parsing -----------------------------------------------------------


def test_webhook_payload_has_slack_text_and_the_structured_alert() -> None:
    alert = Alert("x failed", "because", "failure", {"dag_id": "d", "log_url": "http://af/log"})
    payload = json.loads(json.dumps(alert.webhook_payload()))
    assert payload["text"] == "[FAILED] x failed\nbecause\nLog: http://af/log"
    assert payload["alert"] == {
        "title": "x failed", "text": "because", "severity": "failure",
        "fields": {"dag_id": "d", "log_url": "http://af/log"}, "source": "kafka-retry-scheduler",
    }  # fmt: skip


def test_email_html_escapes_the_text() -> None:
    html = Alert("<b>", "a < b\nnext", "firing", {"check": "<x>"}).email_html()
    assert "a &lt; b<br>next" in html and "&lt;x&gt;" in html and "<b><b>" not in html


def test_failure_context_becomes_an_alert_naming_dag_task_and_run() -> None:
    ti = SimpleNamespace(
        dag_id="retry_monitor", task_id="check", run_id="manual__1", try_number=2, log_url="http://af/l"
    )
    alert = alert_from_context({"ti": ti, "exception": ConnectionError("refused")})
    assert alert.severity == "failure"
    assert alert.title == "retry_monitor.check failed"
    assert (
        alert.text
        == "Task check of DAG retry_monitor failed in run manual__1 (try 2): ConnectionError: refused"
    )
    assert alert.fields["log_url"] == "http://af/l"


def _conn(uri: str | None = None, **kwargs):
    from airflow.sdk import Connection

    return Connection.from_uri(uri, conn_id="c") if uri else Connection(conn_id="c", **kwargs)


@pytest.mark.parametrize(
    ("conn", "url"),
    [
        (dict(uri="http://127.0.0.1:8765/hook"), "http://127.0.0.1:8765/hook"),
        (dict(uri="https://hooks.slack.com/services/T0/B0/XX"), "https://hooks.slack.com/services/T0/B0/XX"),
        (dict(conn_type="http", host="https://hooks.slack.com/services/T0/B0/XX"),
         "https://hooks.slack.com/services/T0/B0/XX"),
        (dict(conn_type="http", schema="https", host="alerts.example.com", port=8443,
              extra=json.dumps({"endpoint": "/v1/hook"})), "https://alerts.example.com:8443/v1/hook"),
    ],
)  # fmt: skip
def test_webhook_url_from_the_connection(conn: dict, url: str) -> None:
    assert webhook_target(_conn(**conn)).url == url


def test_webhook_headers_timeout_and_basic_auth_from_the_connection() -> None:
    conn = _conn(
        conn_type="http", host="https://a.example.com/h", login="u", password="p",
        extra=json.dumps({"headers": {"X-Token": "t"}, "timeout": 3}),
    )  # fmt: skip
    target = webhook_target(conn)
    assert target.headers == {"Authorization": "Basic dTpw", "X-Token": "t"}
    assert target.timeout_s == 3.0
    assert target.safe_url == "https://a.example.com"  # the path of a Slack URL is its secret


def test_webhook_connection_without_host_says_so() -> None:
    with pytest.raises(AlertConfigError, match="connection retry_alert_webhook has no host"):
        webhook_target(_conn(conn_type="http"), "retry_alert_webhook")


def test_email_recipients_from_extra_or_login() -> None:
    assert email_recipients(_conn(conn_type="email", extra=json.dumps({"to": ["a@x", "b@x"]}))) == [
        "a@x",
        "b@x",
    ]
    assert email_recipients(_conn(conn_type="email", login="a@x; b@x")) == ["a@x", "b@x"]
    with pytest.raises(AlertConfigError, match=r'names no recipients: set its extra to \{"to"'):
        email_recipients(_conn(conn_type="email"))


def test_alerts_and_the_log_channel_work_without_airflow() -> None:
    code = (
        "import logging, sys\n"
        "sys.modules['airflow'] = None\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(levelname)s %(message)s')\n"
        "from retry_scheduler.airflow.notifiers import Alert, LogNotifier, WebhookNotifier\n"
        "alert = Alert('t', 'x', 'firing', {'check': 'c'})\n"
        "print(WebhookNotifier().send(alert), LogNotifier().send(alert))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "INFO connection retry_alert_webhook not defined: webhook alerts are off",
        "WARNING ALERT [FIRING] t: x (check=c)",
        "None True",
    ]


def test_a_run_s_failure_context_becomes_an_alert_naming_dag_run_and_reason() -> None:
    run = SimpleNamespace(dag_id="retry_compaction", run_id="scheduled__2026-11-20")
    alert = alert_from_context({"dag_run": run, "reason": "timed_out"})
    assert (alert.title, alert.severity) == ("retry_compaction run failed", "failure")
    assert (
        alert.text == "Run scheduled__2026-11-20 of DAG retry_compaction failed: ran past its dagrun_timeout"
    )
    assert alert.fields == {
        "dag_id": "retry_compaction",
        "run_id": "scheduled__2026-11-20",
        "reason": "timed_out",
        "task_id": None,
    }
    # Airflow hands a run's failure callback the failed task's instance too: still the run's alert
    ti = SimpleNamespace(dag_id="retry_monitor", task_id="check", run_id="manual__1", try_number=1)
    alert = alert_from_context({"ti": ti, "reason": "task_failure"})
    assert alert.text == "Run manual__1 of DAG retry_monitor failed: a task failed (check)"


def test_every_threshold_has_its_check_and_every_check_reads_and_describes_its_figure() -> None:
    """One registry of checks: each names its Thresholds field, reads its figure from a reading and
    describes it; the Variable's keys are exactly the checks' thresholds and the window."""
    import dataclasses

    from retry_scheduler.ops.checks import REGISTRY

    assert {c.threshold for c in REGISTRY} | {"interval_s"} == {
        f.name for f in dataclasses.fields(Thresholds)
    }
    assert tuple(c.name for c in REGISTRY) == CHECKS and len(set(CHECKS)) == len(CHECKS)
    for check in REGISTRY:
        head, detail, fields = check.describe(QUIET, "threshold 1")
        assert head.endswith("(threshold 1)") and detail and isinstance(fields, dict), check.name
        assert QUIET.value(check.name) == check.value(QUIET)
