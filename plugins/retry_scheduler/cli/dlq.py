"""``retry-scheduler dlq``: list, show, replay, purge and audit dead jobs."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from retry_scheduler.cli.progress import progress
from retry_scheduler.core.config import Settings

#: The exit status of a watched replay that stopped by itself (too many came back): not 0, which says
#: it went through, nor 2, which says nothing was done. What it sent stays sent; the rest stays dead.
EXIT_REPLAY_STOPPED = 3


def _dlq_filter(args: argparse.Namespace, settings: Settings) -> Any:
    from retry_scheduler.cli.selection_args import selection_from_args

    return selection_from_args(args, settings)


def _cmd_dlq_list(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.ops.browse import list_dead
    from retry_scheduler.ops.dlq import to_json

    page = list_dead(
        settings.database_url, _dlq_filter(args, settings), page_size=args.page_size, cursor=args.cursor,
        settings=settings,
    )  # fmt: skip
    if args.json:
        print(to_json(page.as_json()))
        return 0
    total = f"{page.total}+" if page.total_capped else str(page.total)
    print(f"{total} dead job(s) match; newest first")
    if page.jobs:
        print(
            f"{'id':>10}  {'dead at (UTC)':<19}  {'destination':<24} {'reason':<9} {'from':<15} "
            f"{'error class':<28} reason"
        )
    for job in page.jobs:
        print(
            f"{job.id:>10}  {job.dead_at.strftime('%Y-%m-%d %H:%M:%S'):<19}  {job.destination or '-':<24} "
            f"{job.dead_reason:<9} {job.written_by or '?':<15} {(job.error_class or '-')[:28]:<28} "
            f"{(job.reason or '')[:60]!r}"
        )
    if page.next_cursor:
        print(f"more: retry-scheduler dlq list ... --cursor {page.next_cursor}")
    return 0


def _cmd_dlq_show(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.ops.browse import show
    from retry_scheduler.ops.dlq import to_json

    job = show(settings.database_url, args.id, limit=args.bytes)
    if args.json:
        print(to_json(job))
        return 0

    def shown(rendered: dict[str, Any] | None) -> str:
        if rendered is None:
            return "(null)"
        note = f"  [{rendered['encoding']}, {rendered['size']} bytes" + (
            ", truncated]" if rendered["truncated"] else "]"
        )
        return (rendered["text"] if rendered["encoding"] == "hex" else repr(rendered["text"])) + note

    for name, value in job.items():
        if name not in ("key", "value", "headers"):
            print(f"{name:>22}: {value}")
    print(f"{'key':>22}: {shown(job['key'])}")
    print(f"{'value':>22}: {shown(job['value'])}")
    for header in job["headers"]:
        print(f"{'header ' + header['name']:>22}: {shown(header['value'])}")
    return 0


def _cmd_dlq_act(args: argparse.Namespace, settings: Settings) -> int:
    """Replay or purge: always a dry run first (printed and audited), then the action if confirmed."""
    import getpass

    from retry_scheduler.core.deployment import Deployment
    from retry_scheduler.ops.dlq import Operation, parse_rate, run_action, to_json
    from retry_scheduler.ops.watch import Watch

    flt = _dlq_filter(args, settings)
    if getattr(args, "reevaluate", False):
        return _reevaluate(args, settings, flt)
    if not args.dry_run and not args.all and not flt.as_dict():
        print(
            f"retry-scheduler: no filter given: this would {args.dlq_command} every dead job. Add --all if "
            "that is what you mean, or a filter (--destination, --dead-reason, --error-class, --search, "
            "--since, --until, --ids); --dry-run counts them",
            file=sys.stderr,
        )
        return 2
    # A purge needs no policies: a policies module that does not load does not stop it.
    deployment = Deployment.load(settings) if args.dlq_command == "replay" else None
    operation = Operation(
        action=args.dlq_command,
        selection=flt,
        actor=f"cli:{getpass.getuser()}",
        source="cli",
        dry_run=True,
        reset_attempts=bool(getattr(args, "reset_attempts", False)),
        rate_per_s=parse_rate(getattr(args, "rate", None)),
        watch=Watch.from_params(
            {
                "canary": getattr(args, "canary", None),
                "verdict_window": getattr(args, "verdict_window", None),
                "stop_above": getattr(args, "stop_above", None),
            }
        ),
    )
    sizing = {} if args.batch_size is None else {"batch_size": args.batch_size}
    plan = run_action(settings.database_url, operation, deployment=deployment, **sizing)
    print(to_json(plan.as_json()) if args.json else plan.summary())
    if args.dry_run or plan.would_affect == 0:
        return 0
    refused = _unconfirmed(
        args, f"{args.dlq_command} these jobs", f"{args.dlq_command} {plan.would_affect} dead job(s)"
    )
    if refused is not None:
        return refused

    with progress(args.dlq_command) as report:
        outcome = run_action(
            settings.database_url,
            replace(operation, dry_run=False),
            progress=report,
            deployment=deployment,
            **sizing,
        )
    print(to_json(outcome.as_json()) if args.json else outcome.summary())
    if outcome.stopped:
        print(
            f"retry-scheduler: the replay stopped by itself: {outcome.stopped}. What it sent stays sent; "
            "the rest stays dead (exit 3). Fix the consumer, then replay again.",
            file=sys.stderr,
        )
        return EXIT_REPLAY_STOPPED
    return 0


def _cmd_dlq_audit(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.ops.dlq import recent_audit, to_json

    rows = recent_audit(settings.database_url, args.limit)
    if args.json:
        print(to_json(rows))
        return 0
    for row in rows:
        mode = "dry run" if row["dry_run"] else f"{row['affected']} done"
        print(
            f"{row['id']:>6}  {row['at'][:19]}  {row['action']:<6} {mode:<10} of {row['matched']:<8} "
            f"by {row['actor']} ({row['source']}{', ' + row['run_id'] if row['run_id'] else ''})  "
            f"filter {json.dumps(row['filter'])}"
        )
        if details := _audit_details(row):
            print(f"{'':>8}{details}")
    return 0


def _audit_details(row: dict[str, Any]) -> str:
    """What the docs send operators to the audit for, beyond its first line: the approval and who
    answered, how a watched replay went and why it stopped, and a run not finished."""
    said = []
    if row.get("approval"):
        said.append(
            f"approval {row['approval']}" + (f" by {row['approved_by']}" if row.get("approved_by") else "")
        )
    if row.get("watch"):
        said.append(f"watched: {row.get('published') or 0} published, {row.get('came_back') or 0} came back")
    if row.get("stopped"):
        said.append(f"STOPPED: {row['stopped']}")
    if row.get("rate_per_s"):
        said.append(f"paced at {row['rate_per_s']:,g}/s")
    if not row["dry_run"] and not row.get("finished_at"):
        said.append("not finished (still running, or interrupted)")
    return "; ".join(said)


def _reevaluate(args: argparse.Namespace, settings: Settings, flt: Any) -> int:
    """``replay --reevaluate``: the invalid jobs read again against the current policies; a dry run first."""
    import getpass

    from retry_scheduler.core.deployment import Deployment
    from retry_scheduler.ops.dlq import BATCH, Operation, run_action, to_json

    if getattr(args, "reset_attempts", False):
        print("retry-scheduler: --reset-attempts does not go with --reevaluate", file=sys.stderr)
        return 2
    if getattr(args, "rate", None) is not None:
        print("retry-scheduler: --rate does not go with --reevaluate (its jobs fall due by their policy)",
              file=sys.stderr)  # fmt: skip
        return 2
    if any(getattr(args, name, None) is not None for name in ("canary", "stop_above", "verdict_window")):
        print("retry-scheduler: --canary, --stop-above and --verdict-window watch a replay, not --reevaluate",
              file=sys.stderr)  # fmt: skip
        return 2
    deployment = Deployment.load(settings)
    operation = Operation(
        action="reevaluate", selection=flt, actor=f"cli:{getpass.getuser()}", source="cli", dry_run=True
    )
    batch_size = BATCH if args.batch_size is None else args.batch_size

    def run(dry_run: bool, report: Callable[[int, int], None] = lambda done, total: None) -> Any:
        return run_action(
            settings.database_url, replace(operation, dry_run=dry_run), deployment=deployment,
            progress=report, batch_size=batch_size,
        )  # fmt: skip

    plan = run(dry_run=True)
    print(to_json(plan.as_json()) if args.json else plan.summary())
    if args.dry_run or plan.would_affect == 0:
        return 0
    refused = _unconfirmed(args, "make them pending", f"make {plan.would_affect} re-evaluated job(s) pending")
    if refused is not None:
        return refused
    with progress("reevaluate") as report:
        outcome = run(dry_run=False, report=report)
    print(to_json(outcome.as_json()) if args.json else outcome.summary())
    return 0


def _unconfirmed(args: argparse.Namespace, to_do: str, question: str) -> int | None:
    """None when the action may go on (``--yes``, or yes at the prompt); else its exit status."""
    if args.yes:
        return None
    if not sys.stdin.isatty():
        print(
            f"retry-scheduler: not confirmed: add --yes to {to_do} (or --dry-run to only count)",
            file=sys.stderr,
        )
        return 2
    if input(f"{question}? [y/N] ").strip().lower() not in ("y", "yes"):
        print("nothing done")
        return 1
    return None


def _add_dlq_filters(parser: argparse.ArgumentParser, *, for_action: bool) -> None:
    from retry_scheduler.cli.selection_args import add_selection_arguments

    add_selection_arguments(parser, limit=for_action)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    if for_action:
        parser.add_argument(
            "--all",
            action="store_true",
            help="act on every dead job the filters match, even with no filter (without one it is refused)",
        )
        parser.add_argument("--dry-run", action="store_true", help="only count (and audit the dry run)")
        parser.add_argument("--yes", action="store_true", help="do it without asking (after the dry run)")
        parser.add_argument(
            "--batch-size",
            type=int,
            metavar="N",
            help="jobs changed per transaction (10000); a crash keeps every batch already committed",
        )


def add_parsers(sub: Any) -> None:
    """Register ``dlq`` and its actions."""
    dlq = sub.add_parser(
        "dlq",
        help="browse, replay and purge dead jobs (same as the Dead letters page and the dlq_replay DAG)",
        description="Dead jobs are kept in PostgreSQL and published to their policy's DLQ topic. "
        "Replay makes them due now (the publish loop sends them to their destination); purge deletes "
        "those already on the DLQ topic. Both always run a dry run first and write an audit row.",
    )
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")

    listing = dlq_sub.add_parser("list", help="dead jobs, newest first, a page at a time")
    _add_dlq_filters(listing, for_action=False)
    listing.add_argument("--page-size", type=int, default=50, metavar="N", help="jobs per page (50)")
    listing.add_argument("--cursor", help="continue after the page that printed this cursor")
    listing.set_defaults(func=_cmd_dlq_list)

    show = dlq_sub.add_parser("show", help="every field of one job, key, value and headers")
    show.add_argument("id", type=int, help="job id (from dlq list)")
    show.add_argument("--bytes", type=int, default=4096, metavar="N", help="show at most N bytes per value")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=_cmd_dlq_show)

    _add_replay_parser(dlq_sub)

    purge = dlq_sub.add_parser(
        "purge",
        help="delete dead jobs whose record is already on the DLQ topic",
        description="Select dead jobs by filter or --ids, show the dry run, and after confirmation delete "
        "them from PostgreSQL. A dead job not yet published to its DLQ topic is kept.",
    )
    _add_dlq_filters(purge, for_action=True)
    purge.set_defaults(func=_cmd_dlq_act)

    audit = dlq_sub.add_parser("audit", help="who replayed or purged what, newest first")
    audit.add_argument("--limit", type=int, default=20, metavar="N", help="rows (20)")
    audit.add_argument("--json", action="store_true", help="machine-readable output")
    audit.set_defaults(func=_cmd_dlq_audit)


def _add_replay_parser(dlq_sub: Any) -> None:
    """``dlq replay``: its filter, pace, watch and re-evaluation options."""
    replay = dlq_sub.add_parser(
        "replay",
        help="make dead jobs due (now, or at --rate's pace); the publish loop sends them to their destination",
        description="Select dead jobs by filter or --ids, show the dry run, and after confirmation make "
        "them due (now, or at --rate's pace) with their attempt kept (or reset with --reset-attempts). "
        "Parked jobs (replayed too often, dead again) are left alone unless --dead-reason parked or "
        "--ids asks for them. Invalid jobs are left "
        "alone: their headers named no usable destination; after fixing the configuration that made "
        "them invalid (a destination not allowed, a policy not deployed), --reevaluate reads them again. "
        "Exit status: 0 done (or nothing to do), 2 refused or not confirmed, 3 a watched replay (--canary, "
        "--stop-above) that stopped by itself because too many came back.",
    )
    _add_dlq_filters(replay, for_action=True)
    replay.add_argument(
        "--reset-attempts", action="store_true", help="start the policy's schedule again (attempt 0)"
    )
    replay.add_argument(
        "--rate",
        metavar="N",
        help="pace the replay: at most N jobs of each destination fall due per second (0 or 'unlimited': "
        "all at once). Default: all at once up to 10 000 jobs per destination, 1 000/s per destination "
        "for a larger replay; the dry run says which",
    )
    replay.add_argument(
        "--canary",
        metavar="N|P%",
        help="send N records first (or P%% of the replay), wait the verdict window, and go on only if none "
        "of them came back (failed again: back on a retry topic, or dead again)",
    )
    replay.add_argument(
        "--stop-above",
        metavar="P%",
        help="send the rest in waves of 10 000, each watched for its verdict window; stop by itself, leaving "
        "the rest dead, when more than P%% of the records sent came back",
    )
    replay.add_argument(
        "--verdict-window",
        metavar="DURATION",
        help="how long after a wave was published to wait for its records to come back (30s)",
    )
    replay.add_argument(
        "--reevaluate",
        action="store_true",
        help="read the invalid jobs of the filter again against the current policies: those that pass "
        "become pending with their original bytes, the rest stay dead with the new reason (no --all needed)",
    )
    replay.set_defaults(func=_cmd_dlq_act)
