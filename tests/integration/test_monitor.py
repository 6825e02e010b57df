"""retry_monitor on the real PostgreSQL: thresholds crossed and not, once per incident, recovery, and
the channels (a local HTTP receiver for the webhook, a local SMTP server for e-mail, the log)."""

from __future__ import annotations

import email
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest

from bench.jobs import Job, insert_jobs
from retry_scheduler.airflow import notifiers as notify
from retry_scheduler.airflow.notifiers import (
    Alert,
    AlertNotifier,
    EmailNotifier,
    LogNotifier,
    WebhookNotifier,
    alert_notifiers,
)
from retry_scheduler.core.jobs import Status
from retry_scheduler.db.store import Store
from retry_scheduler.dev.procs import free_port
from retry_scheduler.ops.monitor import Thresholds, run_monitor

pytestmark = pytest.mark.integration


class WebhookReceiver:
    """A local HTTP endpoint recording every JSON body posted to it (before it answers)."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.posts.append(
                    {
                        "path": self.path,
                        "content_type": self.headers["Content-Type"],
                        "status": receiver.status,
                        "json": json.loads(body),
                    }
                )
                self.send_response(receiver.status)
                self.end_headers()
                self.wfile.write(b"ok" if receiver.status == 200 else b"receiver is down")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def delivered(self) -> list[dict[str, Any]]:
        """The alerts the receiver accepted (HTTP 200)."""
        return [p["json"] for p in self.posts if p["status"] == 200]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook(monkeypatch: pytest.MonkeyPatch) -> Iterator[WebhookReceiver]:
    """The receiver, configured as the ``retry_alert_webhook`` connection."""
    receiver = WebhookReceiver()
    monkeypatch.setenv("AIRFLOW_CONN_RETRY_ALERT_WEBHOOK", receiver.url)
    yield receiver
    receiver.close()


def make_job(
    n: int, *, due_s_ago: float = 0.0, status: Status = Status.PENDING, destination: str = "orders"
) -> Job:
    now = int(time.time() * 1000)
    return Job(
        source_topic="retry", source_partition=0, source_offset=n, source_timestamp_ms=now, destination=destination,
        destination_partition=None, key=b"k", value=b"v", headers=(), attempt=0, policy="default",
        reason="boom", error_class="TimeoutError", consumer_group="g", retry_id=f"id-{n}", original_topic=destination,
        original_partition=None, original_offset=None, original_timestamp_ms=now,
        due_ms=now - int(due_s_ago * 1000), status=status,
        dead_reason="fatal" if status is Status.DEAD else None, dlq_topic="retry.dlq",
    )  # fmt: skip


def publish_all(store: Store, late_s: float) -> int:
    """Mark every due job published ``late_s`` seconds after its due time."""
    with store.conn.transaction():
        rows = store.queue.claim_due(1000)
        due = dict(
            store.conn.execute("SELECT id, (extract(epoch FROM due_at) * 1000)::bigint FROM retry_jobs_all")
        )
        return store.queue.mark_published([(r.id, due[r.id] + int(late_s * 1000)) for r in rows])


def alert_rows(database_url: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(database_url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return {r["check_name"]: r for r in cur.execute("SELECT * FROM retry_alerts")}


def test_overdue_backlog_alerts_once_per_incident_then_resolves_once(
    database_url: str, webhook: WebhookReceiver
) -> None:
    with Store(database_url) as store:
        insert_jobs(store, [make_job(1, due_s_ago=120)])

    first = run_monitor(database_url, Thresholds(), alert_notifiers())
    second = run_monitor(database_url, Thresholds(), alert_notifiers())

    [fired] = webhook.delivered()
    assert webhook.posts[0]["path"] == "/hook"
    assert webhook.posts[0]["content_type"] == "application/json"
    assert fired["text"].startswith("[FIRING] retry_monitor: oldest overdue job is 12")
    assert "late (threshold 60 s)" in fired["text"]
    assert "for orders is" in fired["text"]
    assert fired["alert"]["severity"] == "firing"
    assert fired["alert"]["fields"]["check"] == "oldest_overdue"
    assert fired["alert"]["fields"]["destination"] == "orders"
    assert fired["alert"]["fields"]["value"] >= 120
    assert [a["check"] for a in first["alerts"]] == ["oldest_overdue"]
    assert first["alerts"][0]["channels"] == {"webhook": True, "e-mail": None, "log": True}
    assert (second["alerts"], second["firing"]) == ([], ["oldest_overdue"])
    row = alert_rows(database_url)["oldest_overdue"]
    assert row["firing"] and row["notified_at"] >= row["since"]

    with Store(database_url) as store:
        assert publish_all(store, late_s=0.01) == 1  # the backlog is worked off
    third = run_monitor(database_url, Thresholds(), alert_notifiers())
    fourth = run_monitor(database_url, Thresholds(), alert_notifiers())

    assert len(webhook.delivered()) == 2
    resolved = webhook.delivered()[1]
    assert resolved["text"].startswith("[RESOLVED] retry_monitor: oldest_overdue back to normal")
    assert resolved["alert"]["severity"] == "resolved"
    assert [a["severity"] for a in third["alerts"]] == ["resolved"]
    assert (fourth["alerts"], fourth["firing"]) == ([], [])
    row = alert_rows(database_url)["oldest_overdue"]
    assert not row["firing"] and row["resolved_at"] is not None


def test_nothing_is_sent_while_every_check_is_under_its_threshold(
    database_url: str, webhook: WebhookReceiver
) -> None:
    with Store(database_url) as store:
        insert_jobs(store, [make_job(n, due_s_ago=10) for n in range(10)])
        publish_all(store, late_s=0.5)
        insert_jobs(store, [make_job(100, due_s_ago=20)])  # overdue, but not for long
        insert_jobs(store, [make_job(200 + n, status=Status.DEAD) for n in range(5)])
    thresholds = Thresholds(oldest_overdue_s=30, lateness_p99_s=1.0, dead_per_hour=5)

    result = run_monitor(database_url, thresholds, alert_notifiers())

    assert webhook.posts == []
    assert (result["alerts"], result["firing"]) == ([], [])
    reading = result["reading"]
    assert 20 <= reading["oldest_overdue_s"] < 30
    assert reading["lateness_p99_s"] == pytest.approx(0.5, abs=0.01)
    assert (reading["published"], reading["dead_last_hour"]) == (10, 5)
    rows = alert_rows(database_url)
    assert {c: (r["firing"], r["threshold"]) for c, r in rows.items()} == {
        "oldest_overdue": (False, 30.0),
        "lateness_p99": (False, 1.0),
        "dead_per_hour": (False, 5.0),
        "stuck_delivery": (False, 600.0),  # the 5 dead jobs died just now: not waiting long yet
        "consumer_lag": (False, 100_000.0),  # no reader given: nothing to judge
        "ingest_near_retention": (False, 0.5),
        "removed_unread": (False, 0.0),
        "undelivered_dead": (False, 0.0),  # within the minute they have to reach their DLQ topic
        "failing_deliveries": (False, 0.0),
        "stuck_chains": (False, 3600.0),  # nothing held
        "open_breakers": (False, 0.0),  # no breaker declared
        "letters_unreadable": (False, 0.0),  # no share group's letters
        "letters_near_retention": (False, 0.5),
    }
    assert rows["dead_per_hour"]["value"] == 5.0


def test_late_publishing_crosses_the_lateness_p99_threshold(
    database_url: str, webhook: WebhookReceiver
) -> None:
    with Store(database_url) as store:
        insert_jobs(store, [make_job(n, due_s_ago=10) for n in range(20)])
        publish_all(store, late_s=5.0)

    result = run_monitor(database_url, Thresholds(), alert_notifiers())

    [fired] = webhook.delivered()
    assert fired["text"].startswith(
        "[FIRING] retry_monitor: publish lateness p99 is 5.000 s over the last 300 s (threshold 2 s)"
    )
    assert "20 jobs were published in the last 300 s" in fired["text"]
    assert result["firing"] == ["lateness_p99"]


def test_dead_jobs_of_the_last_hour_count_and_older_ones_do_not(
    database_url: str, webhook: WebhookReceiver
) -> None:
    with Store(database_url) as store:
        insert_jobs(store, [make_job(n, status=Status.DEAD, destination="payments") for n in range(3)])
        insert_jobs(store, [make_job(10 + n, status=Status.DEAD) for n in range(5)])
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE retry_jobs SET dead_at = now() - interval '2 hours', dlq_published_at = now() - interval '2 hours'"
            " WHERE destination = 'orders'"
        )

    under = run_monitor(database_url, Thresholds(dead_per_hour=3), alert_notifiers())
    over = run_monitor(database_url, Thresholds(dead_per_hour=2), alert_notifiers())

    assert under["reading"]["dead_last_hour"] == 3
    assert under["alerts"] == []
    [fired] = webhook.delivered()
    assert fired["text"].startswith("[FIRING] retry_monitor: 3 jobs went dead in the last hour (threshold 2)")
    assert "Dead jobs by destination: payments 3." in fired["text"]
    assert fired["alert"]["fields"]["by_destination"] == {"payments": 3}
    assert [a["check"] for a in over["alerts"]] == ["dead_per_hour"]


def test_a_delivery_failing_for_long_alerts_with_the_broker_s_error_then_resolves(
    database_url: str, webhook: WebhookReceiver
) -> None:
    with Store(database_url) as store:
        insert_jobs(store, [make_job(1, status=Status.DEAD), make_job(2, due_s_ago=5)])
    with psycopg.connect(database_url) as conn:  # job 1 cannot reach its DLQ topic: too large for it
        conn.execute(
            "UPDATE retry_jobs SET dead_at = now() - interval '20 minutes', publish_failures = 9,"
            " last_error = 'delivery failed: Broker: Message size too large' WHERE id = 1"
        )

    # undelivered_dead tells of job 1 early (tested on its own below); this test is the escalation's
    early = Thresholds(undelivered_dead=None)
    under = run_monitor(database_url, replace(early, stuck_delivery_s=1800), alert_notifiers())
    over = run_monitor(database_url, replace(early, stuck_delivery_s=600), alert_notifiers())

    assert under["alerts"] == [] and 1190 < under["reading"]["stuck_delivery_s"] < 1300
    assert [a["check"] for a in over["alerts"]] == ["stuck_delivery"]
    [fired] = webhook.delivered()
    assert fired["text"].startswith("[FIRING] retry_monitor: a delivery has been waiting 12")
    assert "Job 1 has not reached retry.dlq after 9 failed attempts" in fired["text"]
    assert "the last error: delivery failed: Broker: Message size too large" in fired["text"]
    assert fired["alert"]["fields"]["topic"] == "retry.dlq"

    with psycopg.connect(database_url) as conn:  # the topic's limit was raised: it went out
        conn.execute("UPDATE retry_jobs SET dlq_published_at = now() WHERE id = 1")
    after = run_monitor(database_url, replace(early, stuck_delivery_s=600), alert_notifiers())
    assert [a["severity"] for a in after["alerts"]] == ["resolved"]
    assert after["reading"]["stuck_job"] is None  # job 2 is pending and never failed: not stuck


def test_an_alert_the_webhook_refused_is_sent_again_next_run(
    database_url: str, webhook: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    with Store(database_url) as store:
        insert_jobs(store, [make_job(1, due_s_ago=300)])
    webhook.status = 500

    with caplog.at_level(logging.ERROR, logger="retry_scheduler.airflow.notifiers"):
        refused = run_monitor(database_url, Thresholds(), alert_notifiers())
    webhook.status = 200
    retried = run_monitor(database_url, Thresholds(), alert_notifiers())
    quiet = run_monitor(database_url, Thresholds(), alert_notifiers())

    assert [p["status"] for p in webhook.posts] == [500, 200]
    assert refused["alerts"][0]["delivered"] is False
    assert "webhook alert '[FIRING] retry_monitor: oldest overdue job is" in caplog.text
    assert "answered HTTP 500: receiver is down" in caplog.text
    assert webhook.posts[1]["json"]["alert"]["severity"] == "firing"
    assert retried["alerts"][0]["delivered"] is True
    assert quiet["alerts"] == []


def waiting_on_locks(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    return int(row[0]) if row else 0


class Gate(LogNotifier):
    """Holds a monitor run inside its transaction (after its first sends) until released."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def send(self, alert: Alert) -> bool | None:
        self.entered.set()
        self.release.wait(120)
        return True


def test_an_overlapping_run_waits_for_the_first_and_does_not_alert_again(
    database_url: str, webhook: WebhookReceiver
) -> None:
    run_monitor(database_url, Thresholds(), [])  # a quiet run: the incident rows exist from now on
    with Store(database_url) as store:
        insert_jobs(store, [make_job(1, due_s_ago=120)])
    gate = Gate()
    results: dict[str, dict[str, Any]] = {}
    notifiers: dict[str, list[AlertNotifier]] = {
        "first": [WebhookNotifier(), gate],
        "second": alert_notifiers(),
    }

    def run(name: str) -> None:
        results[name] = run_monitor(database_url, Thresholds(), notifiers[name])

    first = threading.Thread(target=run, args=("first",))
    first.start()
    assert gate.entered.wait(60), "the first run never sent its alert"
    second = threading.Thread(target=run, args=("second",))
    second.start()
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            deadline = time.monotonic() + 60
            # Until the second run waits on the first one's row locks (or, were they missing, is done).
            while second.is_alive() and not waiting_on_locks(conn):
                assert time.monotonic() < deadline, "the second run neither waited nor finished"
                time.sleep(0.02)
    finally:
        gate.release.set()
        first.join(60)
        second.join(60)

    assert len(webhook.delivered()) == 1
    assert [a["check"] for a in results["first"]["alerts"]] == ["oldest_overdue"]
    assert (results["second"]["alerts"], results["second"]["firing"]) == ([], ["oldest_overdue"])


class SmtpSink:
    """aiosmtpd handler keeping every message it receives."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], Message]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append((list(envelope.rcpt_tos), email.message_from_bytes(envelope.content)))
        return "250 OK"


@pytest.fixture
def smtp_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[SmtpSink]:
    """A local SMTP server as Airflow's ``smtp_default`` connection."""
    from aiosmtpd.controller import Controller

    sink = SmtpSink()
    port = free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    monkeypatch.setenv(
        "AIRFLOW_CONN_SMTP_DEFAULT",
        json.dumps(
            {
                "conn_type": "smtp",
                "host": "127.0.0.1",
                "port": port,
                "extra": {"disable_ssl": True, "disable_tls": True, "from_email": "airflow@example.com"},
            }
        ),
    )
    yield sink
    controller.stop()


def test_email_alert_goes_out_through_airflow_smtp_connection(
    database_url: str, smtp_server: SmtpSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_RETRY_ALERT_EMAIL",
        json.dumps({"conn_type": "email", "extra": {"to": ["ops@example.com", "oncall@example.com"]}}),
    )
    with Store(database_url) as store:
        insert_jobs(store, [make_job(1, due_s_ago=120, destination="payments")])

    result = run_monitor(database_url, Thresholds(), alert_notifiers())
    run_monitor(database_url, Thresholds(), alert_notifiers())

    [(recipients, message)] = smtp_server.messages
    assert recipients == ["ops@example.com", "oncall@example.com"]
    assert message["From"] == "airflow@example.com"
    assert str(message["Subject"]).startswith("[FIRING] retry_monitor: oldest overdue job is 12")
    [part] = message.get_payload()  # type: ignore[misc]
    body = part.get_payload(decode=True).decode()
    assert "for payments is" in body and "<th align='left'>destination</th><td>payments</td>" in body
    assert result["alerts"][0]["channels"] == {"webhook": None, "e-mail": True, "log": True}


def test_an_e_mail_alert_s_text_is_sent_as_it_is_never_rendered_as_a_template(
    smtp_server: SmtpSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SMTP provider's notifier renders Jinja in what it is not given; an alert's text can carry
    bytes from a Kafka record (an error message), and goes out unrendered."""
    from retry_scheduler.ops.alerts import Alert

    monkeypatch.setenv(
        "AIRFLOW_CONN_RETRY_ALERT_EMAIL",
        json.dumps({"conn_type": "email", "extra": {"to": "ops@example.com"}}),
    )
    hostile = "ValueError: {{ 7 * 7 }} {% for x in range(3) %}x{% endfor %} {{ conf }}"
    assert EmailNotifier().send(
        Alert(title="retry_scheduler.publish failed {{ 6 * 7 }}", text=hostile, severity="failure")
    )
    [(_recipients, message)] = smtp_server.messages
    assert message["Subject"] == "[FAILED] retry_scheduler.publish failed {{ 6 * 7 }}"
    [part] = message.get_payload()  # type: ignore[misc]
    body = part.get_payload(decode=True).decode()
    assert "ValueError: {{ 7 * 7 }} {% for x in range(3) %}x{% endfor %} {{ conf }}" in body


def test_log_is_the_channel_when_no_connection_is_defined(
    database_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notify, "_reported_off", set())  # "said once per process": start this test afresh
    with Store(database_url) as store:
        insert_jobs(store, [make_job(1, due_s_ago=120)])
        insert_jobs(store, [make_job(10 + n, status=Status.DEAD) for n in range(3)])

    with caplog.at_level(logging.INFO, logger="retry_scheduler.airflow.notifiers"):
        result = run_monitor(database_url, Thresholds(dead_per_hour=1), alert_notifiers())

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert warnings[0].startswith("ALERT [FIRING] retry_monitor: oldest overdue job is 12")
    assert "check=oldest_overdue" in warnings[0] and "destination=orders" in warnings[0]
    assert warnings[1].startswith("ALERT [FIRING] retry_monitor: 3 jobs went dead in the last hour")
    off = [r.getMessage() for r in caplog.records if "not defined" in r.getMessage()]
    assert off == [
        "connection retry_alert_webhook not defined: webhook alerts are off",
        "connection retry_alert_email not defined: e-mail alerts are off",
    ]
    assert all(a["delivered"] for a in result["alerts"])  # the log was the only channel, and it took them


def test_failure_callback_never_raises_when_the_channel_is_broken(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_RETRY_ALERT_WEBHOOK", f"http://127.0.0.1:{free_port()}/closed")
    context = {"ti": None, "exception": RuntimeError("kaput")}

    with caplog.at_level(logging.ERROR, logger="retry_scheduler.airflow.notifiers"):
        WebhookNotifier()(context)  # as Airflow calls it
        EmailNotifier(conn_id="retry_alert_webhook")(context)  # an http connection names no recipients
    log = caplog.text

    assert (
        "webhook alert '[FAILED] ?.? failed' not delivered: RuntimeError: cannot reach http://127.0.0.1:"
        in log
    )
    assert (
        "e-mail alert '[FAILED] ?.? failed' not delivered: AlertConfigError: connection retry_alert_webhook"
        in log
    )
