"""The form fields of the replay DAGs: the selection's, named as everywhere else, and the replay's.

``dlq_replay``, ``dlq_window_replay`` and ``retry_bulk_replay`` take the fields of
:class:`~retry_scheduler.db.selection.Selection` under the same names as the command lines and the
Dead letters page (``destination``, ``dead_reason``, ``written_by``, ``error_class``, ``search``,
``since``, ``until``, ``ids``, ``limit``; ``status`` for the bulk retry), and their tasks read them
with ``Selection.from_params``.
"""

from __future__ import annotations

from airflow.sdk import Param

from retry_scheduler.core.adopt import WRITERS
from retry_scheduler.core.protocol import DEAD_REASONS, TOPIC_PATTERN
from retry_scheduler.db.selection import MAX_LIMIT, MAX_TEXT
from retry_scheduler.ops.dlq import DEFAULT_REPLAY_RATE, MAX_RATE, UNPACED_UP_TO
from retry_scheduler.ops.watch import DEFAULT_VERDICT_S


def selection_params(*, status: bool = False, window: bool = True) -> dict[str, Param]:
    """The fields that choose jobs. ``status``: dead or pending jobs (the bulk retry), else dead
    ones; ``window``: ``since``, ``until``, ``ids`` and ``limit`` (the hourly replay's window is its
    data interval)."""
    jobs = "jobs" if status else "dead jobs"
    fields: dict[str, Param] = {
        "destination": Param(
            None,
            type=["null", "string"],
            pattern=f"^{TOPIC_PATTERN}$",
            title="Destination topic",
            description=f"Only {jobs} for this destination (empty: every destination).",
        ),
    }
    if status:
        fields["status"] = Param("dead", enum=["dead", "pending"], title="Status", description="Which jobs.")
    fields |= {
        "dead_reason": Param(
            None,
            type=["null", "string"],
            enum=[None, *DEAD_REASONS],
            title="Dead reason",
            description="Only dead jobs of this reason.",
        ),
        "written_by": Param(
            None,
            type=["null", "string"],
            enum=[None, *WRITERS],
            title="Written by",
            description="Only letters this service wrote (read from its retry topics), or read from that "
            "tool's dead-letter topics (RETRY_ADOPT_TOPICS).",
        ),
        "error_class": Param(
            None,
            type=["null", "string"],
            maxLength=MAX_TEXT,
            title="Error class",
            description="Glob on the error class, e.g. *TimeoutError.",
        ),
        "search": Param(
            None,
            type=["null", "string"],
            maxLength=MAX_TEXT,
            title="Reason text",
            description=f"Only {jobs} whose reason or error class contains this text (any case).",
        ),
    }
    if not window:
        return fields
    failed = (
        "When the job last failed: when it went dead (dead jobs), when its retry was stored (pending jobs)."
        if status
        else "When the job went dead."
    )
    return fields | {
        "since": Param(
            None, type=["null", "string"], format="date-time", title="Failed since (UTC)", description=failed
        ),
        "until": Param(
            None, type=["null", "string"], format="date-time", title="Failed until (UTC)", description=failed
        ),
        "ids": Param(
            None,
            type=["null", "string"],
            pattern=r"^[0-9][0-9,\s]*$",
            title="Job ids",
            description="Only these jobs: ids separated by commas (from the Dead letters page).",
        ),
        "limit": Param(
            0,
            type="integer",
            minimum=0,
            maximum=MAX_LIMIT,
            title="Limit",
            description="At most this many, oldest first (0: all).",
        ),
    }


def rate_param(default_text: str) -> Param:
    """A replay's pace: at most this many jobs of each destination per second; ``default_text`` says
    what an empty field does."""
    return Param(
        None,
        type=["null", "number"],
        minimum=0,
        maximum=MAX_RATE,
        title="Rate (jobs/s per destination)",
        description=f"Pace the replay: at most this many jobs of each destination per second. {default_text}",
    )


def replay_option_params() -> dict[str, Param]:
    """How a replay goes: from attempt 0 or not, at what pace, and a dry run by default."""
    return {
        "reset_attempts": Param(
            False, type="boolean", title="Reset attempts", description="Replay from attempt 0."
        ),
        "rate": rate_param(
            f"0: all at once. Empty: all at once up to {UNPACED_UP_TO:,} jobs per destination, "
            f"{DEFAULT_REPLAY_RATE:,.0f}/s per destination for a larger replay; the run's log says which."
        ),
        **watch_params(),
        "dry_run": Param(True, type="boolean", title="Dry run", description="Only count; change nothing."),
    }


def watch_params() -> dict[str, Param]:
    """A watched replay's fields (:class:`~retry_scheduler.ops.watch.Watch`): a canary, the verdict
    window and the share of records coming back that stops the replay."""
    return {
        "canary": Param(
            None,
            type=["null", "string"],
            pattern=r"^\s*([0-9]+|[0-9]+(\.[0-9]+)?\s*%)\s*$",
            title="Canary",
            description="Send this many records first (or a share, '5%'), wait the verdict window, and go on "
            "only if none of them came back (failed again). Empty: no canary.",
        ),
        "verdict_window": Param(
            None,
            type=["null", "string"],
            pattern=r"^\s*([0-9]+(\.[0-9]+)?(ms|s|m|h)?)+\s*$",
            title="Verdict window",
            description=f"How long after a wave of the replay was published to wait for its records to come "
            f"back ('30s', '2m'). Empty: {DEFAULT_VERDICT_S:g} s.",
        ),
        "stop_above": Param(
            None,
            type=["null", "string"],
            pattern=r"^\s*[0-9]+(\.[0-9]+)?\s*%?\s*$",
            title="Stop above (share coming back)",
            description="Send the rest in waves of 10,000, each watched; stop, leaving the rest dead, when more "
            "than this share of the records sent came back ('20%'). Empty: only the canary can stop it.",
        ),
    }
