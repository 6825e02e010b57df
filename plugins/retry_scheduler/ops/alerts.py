"""An alert: a monitor incident starting or ending, a failed task, or a run past its deadline, rendered
for each channel."""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

_MAX_ERROR_CHARS = 2000

Severity = Literal["firing", "resolved", "failure", "late"]
_TAGS: dict[str, str] = {"firing": "FIRING", "resolved": "RESOLVED", "failure": "FAILED", "late": "LATE"}


@dataclass(frozen=True)
class Alert:
    """One notification: a monitor incident starting or ending, a failed task, or a run past its deadline."""

    title: str
    text: str
    severity: Severity
    #: Structured details: dag_id, task_id, run_id, log_url for a failure; check, value, threshold... for
    #: a monitor incident. Values are JSON-serialisable.
    fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def headline(self) -> str:
        return f"[{_TAGS[self.severity]}] {self.title}"

    def summary(self) -> str:
        """The plain-text message (Slack's ``text``, the log line)."""
        lines = [self.headline, self.text]
        if self.fields.get("log_url"):
            lines.append(f"Log: {self.fields['log_url']}")
        return "\n".join(line for line in lines if line)

    def webhook_payload(self) -> dict[str, Any]:
        """JSON body: a top-level ``text`` (what a Slack incoming webhook shows) plus the structured alert."""
        return {
            "text": self.summary(),
            "alert": {
                "title": self.title,
                "text": self.text,
                "severity": self.severity,
                "fields": dict(self.fields),
                "source": "kafka-retry-scheduler",
            },
        }

    def email_html(self) -> str:
        rows = "".join(
            f"<tr><th align='left'>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
            for k, v in self.fields.items()
            if v is not None
        )
        text = html.escape(self.text).replace("\n", "<br>")
        return f"<p><b>{html.escape(self.headline)}</b></p><p>{text}</p><table>{rows}</table>"


def alert_from_context(context: Mapping[str, Any]) -> Alert:
    """The Alert for a failure callback's context: a task's (``ti``, ``exception``...) or, without a
    task instance, a DAG run's (``dag_run``, ``reason``: ``task_failure``, ``timed_out``...)."""
    ti = context.get("ti") or context.get("task_instance")
    if context.get("reason"):  # only a DAG run's callback has one (its failed task's ti, if any, too)
        return _run_alert(context)
    dag = context.get("dag")
    dag_id = getattr(ti, "dag_id", None) or getattr(dag, "dag_id", None) or "?"
    task_id = getattr(ti, "task_id", None) or "?"
    run_id = getattr(ti, "run_id", None) or context.get("run_id")
    try_number = getattr(ti, "try_number", None)
    try:
        log_url = getattr(ti, "log_url", None)
    except Exception:  # a property reading the config; an alert without the link is still an alert
        log_url = None
    error = context.get("exception")
    reason = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error or "")
    if len(reason) > _MAX_ERROR_CHARS:
        reason = reason[:_MAX_ERROR_CHARS] + "..."
    text = f"Task {task_id} of DAG {dag_id} failed in run {run_id}" + (
        f" (try {try_number})" if try_number else ""
    )
    return Alert(
        title=f"{dag_id}.{task_id} failed",
        text=f"{text}: {reason}" if reason else text,
        severity="failure",
        fields={
            "dag_id": dag_id,
            "task_id": task_id,
            "run_id": run_id,
            "try_number": try_number,
            "log_url": log_url,
            "error": reason or None,
        },
    )


def _run_alert(context: Mapping[str, Any]) -> Alert:
    run, ti = context.get("dag_run"), context.get("ti") or context.get("task_instance")
    dag_id = (
        next((getattr(o, "dag_id", None) for o in (run, ti, context.get("dag")) if o is not None), None)
        or "?"
    )
    run_id = getattr(run, "run_id", None) or getattr(ti, "run_id", None) or context.get("run_id")
    reason = str(context.get("reason") or "")[:_MAX_ERROR_CHARS]
    why = {"timed_out": "ran past its dagrun_timeout", "task_failure": "a task failed"}.get(reason, reason)
    task_id = getattr(ti, "task_id", None)
    text = f"Run {run_id} of DAG {dag_id} failed: {why}" + (f" ({task_id})" if task_id else "")
    return Alert(
        title=f"{dag_id} run failed",
        text=text,
        severity="failure",
        fields={"dag_id": dag_id, "run_id": run_id, "reason": reason, "task_id": task_id},
    )


def deadline_alert_from_context(context: Mapping[str, Any]) -> Alert:
    """The Alert for a missed Deadline Alert: the context Airflow hands its callback holds the run
    (``dag_run``, as the REST API shows it) and the ``deadline`` (``deadline_time``)."""
    run = context.get("dag_run") or {}
    deadline = context.get("deadline") or {}
    dag_id = str(run.get("dag_id") or "?")
    run_id = str(run.get("dag_run_id") or run.get("run_id") or "?")
    queued_at, due = run.get("queued_at"), deadline.get("deadline_time")
    state = run.get("state")
    text = (
        f"Run {run_id} of DAG {dag_id} has not finished by its deadline, {due}"
        + (f" (queued at {queued_at})" if queued_at else "")
        + (f"; it is {state}" if state else "")
        + ". Look at its tasks' logs: a slow Spark job, a cluster short of executors, or a lock held by another run."
    )
    return Alert(
        title=f"{dag_id} run {run_id} missed its deadline",
        text=text,
        severity="late",
        fields={"dag_id": dag_id, "run_id": run_id, "queued_at": queued_at, "deadline": due, "state": state},
    )


class Channel(Protocol):
    """Where the monitor sends an alert: the Airflow notifiers (``retry_scheduler.airflow.notifiers``)
    or anything shaped like them."""

    #: A name for the channel in the alert's record (``webhook``, ``email``, ``log``...).
    kind: str
    #: Whether a person sees what it takes (a webhook, an e-mail; not the log).
    reaches_people: bool

    def send(self, alert: Alert) -> bool | None:
        """Deliver ``alert``: True when the channel took it, False when it failed, None when the
        channel is not configured."""
        ...
