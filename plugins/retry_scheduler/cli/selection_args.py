"""A job selection's options, the same names on every command line (``dlq``, ``bulk-retry`` and the
Spark job's own), read back into one :class:`~retry_scheduler.db.selection.Selection`."""

from __future__ import annotations

import argparse
from dataclasses import replace

from retry_scheduler.core import protocol
from retry_scheduler.core.adopt import WRITERS
from retry_scheduler.core.config import Settings
from retry_scheduler.core.durations import TIME_HELP, moment
from retry_scheduler.core.jobs import Status
from retry_scheduler.db.selection import SELECTABLE, Selection, source_topics


def at_least_one(text: str) -> int:
    """A command line's ``--limit``: a whole number, at least 1 (0 is not "no limit")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value} (for no limit, leave --limit out)")
    return value


def add_selection_arguments(
    parser: argparse.ArgumentParser, *, status: bool = False, limit: bool = True, for_job: bool = False
) -> None:
    """The selection's options, the same names on every command line: read them back with
    :func:`selection_from_args`. ``status``: offer ``--status`` (dead or pending); ``limit``: offer
    ``--limit`` (not for a list, which pages); ``for_job``: the job's ``--source-topics`` (what
    ``--written-by`` named, resolved by the submitter)."""

    parser.add_argument("--destination", metavar="TOPIC", help="only jobs for this destination topic")
    if status:
        parser.add_argument(
            "--status",
            choices=[s.value for s in SELECTABLE],
            default=Status.DEAD.value,
            help="which jobs (dead)",
        )
    parser.add_argument("--dead-reason", choices=protocol.DEAD_REASONS, help="only dead jobs of this reason")
    parser.add_argument("--error-class", metavar="GLOB", help="glob on the error class, e.g. '*Timeout*'")
    parser.add_argument("--search", metavar="TEXT", help="text in the reason or error class (any case)")
    parser.add_argument(
        "--written-by",
        choices=WRITERS,
        help="only letters this service wrote (read from its retry topics) or read from the dead-letter "
        "topics of that tool (RETRY_ADOPT_TOPICS)",
    )
    # A job's times are checked with the rest of its selection (one line on stderr, exit status 2).
    time = str if for_job else moment
    parser.add_argument(
        "--since",
        type=time,
        metavar="TIME",
        help=f"last failed (went dead; stored, for pending jobs) at or after this: {TIME_HELP}",
    )
    parser.add_argument("--until", type=time, metavar="TIME", help=f"last failed before this: {TIME_HELP}")
    parser.add_argument("--ids", metavar="ID,ID", help="only these job ids")
    if limit:
        parser.add_argument(
            "--limit",
            type=at_least_one,
            metavar="N",
            help="at most N jobs, oldest first (no limit: leave it out)",
        )
    if for_job:
        parser.add_argument("--source-topics", metavar="TOPIC,TOPIC", help=argparse.SUPPRESS)


#: The option names :func:`add_selection_arguments` adds, as :meth:`Selection.from_params` reads them.
SELECTION_PARAMS = (
    "status", "destination", "dead_reason", "error_class", "search", "written_by", "since", "until", "ids",
    "limit",
)  # fmt: skip


def selection_from_args(args: argparse.Namespace, settings: Settings | None) -> Selection:
    """The :class:`Selection` of a command line's options (a time without a zone is UTC)."""
    params = {name: getattr(args, name, None) for name in SELECTION_PARAMS}
    selection = Selection.from_params(params, settings, naive_is_utc=True)
    topics = source_topics(getattr(args, "source_topics", None))
    return replace(selection, source_topics=topics) if topics and not selection.source_topics else selection
