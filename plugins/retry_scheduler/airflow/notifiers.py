"""Alerts and the channels that carry them: a webhook (Slack-compatible JSON), e-mail, the log.

Each notifier is an Airflow ``BaseNotifier`` configured by a connection read when it sends, never
when a DAG file is parsed: ``retry_alert_webhook`` and ``retry_alert_email``. It serves twice:

* as a task ``on_failure_callback`` (``failure_notifiers()`` in every DAG's ``default_args``): the
  failure context becomes an :class:`Alert` naming the DAG, task, run and log;
* from ``retry_monitor`` (``retry_scheduler.ops.monitor``), which calls ``send(alert)`` directly.

A channel whose connection is not defined is off: it says so once in the log and does nothing. A
delivery that fails is logged and reported by ``send`` returning False, never raised: a broken
alert channel must not fail the task it reports on.

Any other Airflow notifier (Slack, Apprise, SMTP, the HTTP provider's...) is a channel too: list
instances in ``ALERT_CHANNELS`` in the policies module (or name such a list in the setting
``RETRY_ALERT_CHANNELS``, ``package.module:NAME``). Each is wrapped in a :class:`NotifierChannel`,
which renders the notifier's templated fields with the alert in the context (``{{ alert.summary() }}``,
``{{ alert.headline }}``, ``{{ alert.text }}``, ``{{ alert.severity }}``, ``{{ alert.fields }}``)
and calls its ``notify``: the monitor's alerts and every failure callback go to the same list.

:class:`Alert` (:mod:`retry_scheduler.ops.alerts`) and its formatting need no Airflow; the notifiers work without it too.
"""

from __future__ import annotations

import base64
import copy
import importlib
import json
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from retry_scheduler.ops.alerts import Alert, alert_from_context

log = logging.getLogger(__name__)

WEBHOOK_CONN_ID = "retry_alert_webhook"
#: The setting naming a list of notifiers elsewhere than the policies module: ``package.module:NAME``.
CHANNELS_SETTING = "RETRY_ALERT_CHANNELS"
#: The list of notifiers in the policies module.
CHANNELS_NAME = "ALERT_CHANNELS"
EMAIL_CONN_ID = "retry_alert_email"
DEFAULT_TIMEOUT_S = 10.0
_DEFAULT_EMAIL_BACKEND = "airflow.utils.email.send_email_smtp"


class AlertConfigError(ValueError):
    """An alert connection is defined but unusable; the message names the connection and the field."""


class _PlainNotifier:
    """Stands in for Airflow's BaseNotifier where Airflow is not installed."""

    def __init__(self) -> None:
        pass

    def __call__(self, context: Any) -> None:
        self.notify(context)

    def notify(self, context: Any) -> None:
        raise NotImplementedError


if TYPE_CHECKING:
    from airflow.sdk import BaseNotifier
else:
    try:
        from airflow.sdk import BaseNotifier
    except ImportError:  # the ``service`` install: Alert and the log notifier work without Airflow
        BaseNotifier = _PlainNotifier

# Connections found undefined in this process: each is reported once, not on every alert.
_reported_off: set[str] = set()


def _connection(conn_id: str) -> Any | None:
    """The Airflow connection, or None when it is not defined (or Airflow is not installed)."""
    try:
        from airflow.sdk import BaseHook
        from airflow.sdk.exceptions import AirflowNotFoundException
    except ImportError:
        return None
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


class AlertNotifier(BaseNotifier):
    """A channel: ``send(alert)`` for the monitor, ``notify(context)`` as a task failure callback."""

    #: How the channel is named in log lines ("webhook alerts are off").
    kind: str = "alert"
    #: Whether a delivery reaches a person (the monitor retries an incident nobody was told about).
    reaches_people: bool = True

    def __init__(self, conn_id: str | None = None) -> None:
        super().__init__()
        self.conn_id = conn_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}(conn_id={self.conn_id!r})"

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Nothing to render: a channel has no templated fields (and ``dag.test()`` hands a DAG run's
        callback a serialized DAG, which has no template environment)."""

    def notify(self, context: Any) -> None:
        """The Airflow callback: never raises, so a broken channel cannot fail the task."""
        try:
            alert = alert_from_context(context)
        except Exception:
            log.exception("cannot build a failure alert from the task context")
            return
        self.send(alert)

    def send(self, alert: Alert) -> bool | None:
        """Deliver ``alert``: True when delivered, False when delivery failed, None when the channel is off."""
        conn = None
        if self.conn_id is not None:
            try:
                conn = _connection(self.conn_id)
            except Exception as exc:  # a secrets backend down: as much a failed delivery as a refused post
                log.error(
                    "%s alert %r not delivered: cannot read connection %s: %s",
                    self.kind,
                    alert.headline,
                    self.conn_id,
                    exc,
                )
                return False
            if conn is None:
                if self.conn_id not in _reported_off:
                    _reported_off.add(self.conn_id)
                    log.info("connection %s not defined: %s alerts are off", self.conn_id, self.kind)
                return None
        try:
            self.deliver(alert, conn)
        except Exception as exc:
            log.error("%s alert %r not delivered: %s: %s", self.kind, alert.headline, type(exc).__name__, exc)
            return False
        return True

    def deliver(self, alert: Alert, conn: Any) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class WebhookTarget:
    url: str
    headers: dict[str, str]
    timeout_s: float

    @property
    def safe_url(self) -> str:
        """Scheme and host only: the path of a Slack webhook URL is its secret."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def webhook_target(conn: Any, conn_id: str = WEBHOOK_CONN_ID) -> WebhookTarget:
    """The URL, headers and timeout from an http connection.

    ``host`` may hold the full URL (``https://hooks.slack.com/services/...``); otherwise the URL is
    built from the parts, as ``AIRFLOW_CONN_RETRY_ALERT_WEBHOOK='https://host:port/path'`` gives them
    (scheme in the connection type, or in ``schema`` when that is http/https, path in ``schema`` or
    the extra's ``endpoint``). Extra: ``{"headers": {...}, "timeout": 10, "endpoint": "/path"}``.
    """
    extra = dict(conn.extra_dejson or {})
    headers = extra.get("headers") or {}
    if isinstance(headers, str):  # a URI's query string gives strings
        try:
            headers = json.loads(headers)
        except ValueError:
            raise AlertConfigError(f"connection {conn_id}: extra 'headers' must be a JSON object") from None
    if not isinstance(headers, dict):
        raise AlertConfigError(f"connection {conn_id}: extra 'headers' must be a JSON object")
    try:
        timeout_s = float(extra.get("timeout", DEFAULT_TIMEOUT_S))
    except (TypeError, ValueError):
        raise AlertConfigError(f"connection {conn_id}: extra 'timeout' must be a number of seconds") from None
    host = (conn.host or "").strip()
    if not host:
        raise AlertConfigError(f"connection {conn_id} has no host: set it to the webhook URL")
    endpoint = str(extra.get("endpoint") or "")
    if "://" in host:
        url = host.rstrip("/") + "/" + endpoint.lstrip("/") if endpoint else host
    else:
        schema = (conn.schema or "").strip()
        if schema.lower() in ("http", "https"):
            scheme, path = schema.lower(), endpoint
        else:
            scheme = "https" if (conn.conn_type or "").lower() == "https" else "http"
            path = schema or endpoint
        port = f":{conn.port}" if conn.port else ""
        url = f"{scheme}://{host}{port}/{path.lstrip('/')}"
    if conn.login:
        token = base64.b64encode(f"{conn.login}:{conn.password or ''}".encode()).decode()
        headers = {"Authorization": f"Basic {token}", **headers}
    return WebhookTarget(url, {str(k): str(v) for k, v in headers.items()}, timeout_s)


class WebhookNotifier(AlertNotifier):
    """Posts the alert as JSON to the ``retry_alert_webhook`` URL; a Slack incoming webhook works as is."""

    kind = "webhook"

    def __init__(self, conn_id: str = WEBHOOK_CONN_ID) -> None:
        super().__init__(conn_id)

    def deliver(self, alert: Alert, conn: Any) -> None:
        target = webhook_target(conn, self.conn_id or WEBHOOK_CONN_ID)
        body = json.dumps(alert.webhook_payload(), default=str).encode()
        request = urllib.request.Request(
            target.url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": "kafka-retry-scheduler",
                **target.headers,
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=target.timeout_s) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            detail = exc.read(300).decode("utf-8", "replace")
            raise RuntimeError(f"{target.safe_url} answered HTTP {exc.code}: {detail}") from None
        except OSError as exc:
            raise RuntimeError(f"cannot reach {target.safe_url}: {exc}") from None
        log.info("webhook alert %r posted to %s (HTTP %s)", alert.headline, target.safe_url, status)


def email_recipients(conn: Any, conn_id: str = EMAIL_CONN_ID) -> list[str]:
    """Recipients: the extra's ``to`` (a list or a comma-separated string), else the login."""
    raw = conn.extra_dejson.get("to") or conn.login
    if isinstance(raw, str):
        raw = raw.replace(";", ",").split(",")
    recipients = [str(r).strip() for r in raw or [] if str(r).strip()]
    if not recipients:
        raise AlertConfigError(
            f'connection {conn_id} names no recipients: set its extra to {{"to": ["ops@example.com"]}}'
        )
    return recipients


class EmailNotifier(AlertNotifier):
    """E-mails the alert through Airflow's e-mail setup; recipients from ``retry_alert_email``.

    Sends with the SMTP provider's ``SmtpNotifier`` through the SMTP connection named by
    ``[email] email_conn_id`` (default ``smtp_default``; the extra ``smtp_conn_id`` of
    ``retry_alert_email`` overrides it), or through ``[email] email_backend`` when that is set to
    another backend (SES, SendGrid...). The sender is the extra's ``from_email``, else
    ``[email] from_email``, else the SMTP connection's ``from_email``.

    The webhook channel does not use the HTTP provider's ``HttpNotifier``: its hook logs the whole
    URL (a connection error's message names it), and a Slack webhook URL's path is its secret.
    """

    kind = "e-mail"

    def __init__(self, conn_id: str = EMAIL_CONN_ID) -> None:
        super().__init__(conn_id)

    def deliver(self, alert: Alert, conn: Any) -> None:
        from airflow.sdk.configuration import conf

        conn_id = self.conn_id or EMAIL_CONN_ID
        to = email_recipients(conn, conn_id)
        extra = conn.extra_dejson
        from_email = extra.get("from_email") or conf.get("email", "from_email", fallback=None)
        backend = conf.get("email", "email_backend", fallback=_DEFAULT_EMAIL_BACKEND)
        if backend and backend != _DEFAULT_EMAIL_BACKEND:
            send = conf.getimport("email", "email_backend")
            send(
                to,
                alert.headline,
                alert.email_html(),
                conn_id=conf.get("email", "email_conn_id", fallback=None),
                from_email=from_email,
            )
        else:
            # The SMTP provider's own notifier. Subject and body are given, so it renders neither as a
            # template (they carry text from Kafka records): only a missing sender, from the connection.
            from airflow.providers.smtp.notifications.smtp import SmtpNotifier

            SmtpNotifier(
                to=to,
                from_email=from_email,
                subject=alert.headline,
                html_content=alert.email_html(),
                smtp_conn_id=extra.get("smtp_conn_id") or None,
            ).notify({})
        log.info("e-mail alert %r sent to %s", alert.headline, ", ".join(to))


class LogNotifier(AlertNotifier):
    """Logs the alert: ERROR for a failed task, WARNING for a monitor incident starting or ending."""

    kind = "log"
    reaches_people = False

    def __init__(self) -> None:
        super().__init__(None)

    def deliver(self, alert: Alert, conn: Any) -> None:
        level = logging.ERROR if alert.severity == "failure" else logging.WARNING
        details = ", ".join(f"{k}={v}" for k, v in alert.fields.items() if v is not None and k != "log_url")
        log.log(level, "ALERT %s: %s%s", alert.headline, alert.text, f" ({details})" if details else "")


class NotifierChannel(AlertNotifier):
    """Any Airflow notifier as a channel: ``SlackWebhookNotifier``, ``AppriseNotifier``, ``SmtpNotifier``...

    Each alert renders a copy of the notifier (its templated fields, with ``alert`` in the context), so
    one declared instance serves every alert; its ``notify`` then sends it. A notifier that raises
    has not delivered (``send`` returns False), and the error is logged, never raised.
    """

    def __init__(self, notifier: Any, *, reaches_people: bool = True, name: str | None = None) -> None:
        super().__init__(None)
        if not callable(getattr(notifier, "notify", None)):
            raise AlertConfigError(
                f"{notifier!r} is not an Airflow notifier (a BaseNotifier such as SlackWebhookNotifier)"
            )
        self.notifier = notifier
        self.kind = name or type(notifier).__name__
        self.reaches_people = reaches_people
        self._context: Mapping[str, Any] = {}

    def __repr__(self) -> str:
        return f"NotifierChannel({self.notifier!r})"

    def notify(self, context: Any) -> None:
        """The Airflow callback: the failure alert, with the task's context for the templates."""
        self._context = context if isinstance(context, Mapping) else {}
        try:
            super().notify(context)
        finally:
            self._context = {}

    def deliver(self, alert: Alert, conn: Any) -> None:
        context: dict[str, Any] = dict(self._context or _current_context())
        context["alert"] = alert
        notifier = copy.copy(self.notifier)  # rendering replaces the templates: keep them for the next alert
        render = getattr(notifier, "render_template_fields", None)
        if render is not None:
            # a template environment of its own: dag.test() hands a DAG run's callback a serialized
            # DAG, which has none
            render(context, jinja_env=notifier.get_template_env())
        notifier.notify(context)
        log.info("%s alert %r sent", self.kind, alert.headline)


def _current_context() -> Mapping[str, Any]:
    """The running task's context (the monitor's), or nothing outside a task."""
    try:
        from airflow.sdk import get_current_context

        return get_current_context()
    except Exception:  # not in a task, or no Airflow: the alert alone
        return {}


def declared_channels(env: Mapping[str, str] | None = None) -> list[AlertNotifier]:
    """The channels a deployment declared: ``ALERT_CHANNELS`` of the policies module, or the list
    ``RETRY_ALERT_CHANNELS`` names. An entry is an Airflow notifier (wrapped in a
    :class:`NotifierChannel`) or one of this module's channels (a second webhook connection, say).

    Raises :class:`AlertConfigError` naming the entry that is neither, or the setting that cannot be read.
    """
    env = os.environ if env is None else env
    where = env.get(CHANNELS_SETTING, "").strip()
    if where:
        module_name, _, attr = where.partition(":")
        if not module_name or not attr:
            raise AlertConfigError(f"{CHANNELS_SETTING}={where!r}: name a list as package.module:NAME")
        try:
            entries = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise AlertConfigError(f"{CHANNELS_SETTING}={where!r}: {type(exc).__name__}: {exc}") from None
    else:
        from retry_scheduler.airflow.hook import with_airflow_policies
        from retry_scheduler.core.config import ConfigError, Settings
        from retry_scheduler.core.policy import load_policies_module

        try:  # the modules the tasks load, the DAGs folder of airflow.cfg included
            paths = with_airflow_policies(Settings.from_env(dict(env))).policies_files
        except ConfigError as exc:
            raise AlertConfigError(str(exc)) from None
        where = ", ".join(f"{path}: {CHANNELS_NAME}" for path in paths)
        entries = []
        for path in paths:  # each team's module may add its own channels
            declared = getattr(load_policies_module(path), CHANNELS_NAME, [])
            if not isinstance(declared, Sequence) or isinstance(declared, str | bytes):
                raise AlertConfigError(
                    f"{path}: {CHANNELS_NAME} must be a list of notifiers, not {type(declared).__name__}"
                )
            entries += declared
    if not isinstance(entries, Sequence) or isinstance(entries, str | bytes):
        raise AlertConfigError(f"{where} must be a list of notifiers, not {type(entries).__name__}")
    channels: list[AlertNotifier] = []
    for n, entry in enumerate(entries):
        if isinstance(entry, AlertNotifier):
            channels.append(entry)
        elif callable(getattr(entry, "notify", None)):
            kind = type(entry).__name__
            taken = sum(1 for c in channels if c.kind == kind or c.kind.startswith(f"{kind}#"))
            channels.append(NotifierChannel(entry, name=f"{kind}#{taken + 1}" if taken else kind))
        else:
            raise AlertConfigError(
                f"{where}[{n}] is {type(entry).__name__}, not a notifier: list notifier instances, "
                "such as SlackWebhookNotifier(slack_webhook_conn_id='slack', text='{{ alert.summary() }}')"
            )
    return channels


def builtin_notifiers() -> list[AlertNotifier]:
    """The built-in channels: webhook, e-mail and log (the first two off until their connection is defined)."""
    return [WebhookNotifier(), EmailNotifier(), LogNotifier()]


def alert_notifiers() -> list[AlertNotifier]:
    """Every channel: the built-ins, then the declared ones (:func:`declared_channels`), read now."""
    return builtin_notifiers() + declared_channels()


class DeclaredChannels(AlertNotifier):
    """The declared channels as one failure callback: read when a failure is reported (not when a DAG
    file is parsed), so a deployment's channels change without touching the DAGs. A declaration that
    cannot be read is logged: the built-in channels still report the failure."""

    kind = "declared"

    def __init__(self) -> None:
        super().__init__(None)

    def notify(self, context: Any) -> None:
        try:
            channels = declared_channels()
        except Exception as exc:
            log.error("the declared alert channels cannot be read: %s: %s", type(exc).__name__, exc)
            return
        for channel in channels:
            channel.notify(context)


def failure_notifiers() -> list[AlertNotifier]:
    """The ``on_failure_callback`` of every task and DAG: the built-in channels and the declared ones."""
    return [*builtin_notifiers(), DeclaredChannels()]
