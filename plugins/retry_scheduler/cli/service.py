"""Commands of the running service: ``db migrate``, ``status``, ``run``."""

from __future__ import annotations

import argparse
import json
import logging
import threading
from typing import Any

from retry_scheduler.cli.args import DURATION_HELP, seconds
from retry_scheduler.core.config import Settings
from retry_scheduler.core.jobs import Status

log = logging.getLogger("retry_scheduler")


def _cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.db.schema import migrate

    applied = migrate(settings.database_url)
    if args.json:
        print(json.dumps({"applied": applied}))
    else:
        print(
            f"applied {len(applied)} migration(s): {', '.join(applied)}"
            if applied
            else "schema is up to date"
        )
    return 0


def status_report(settings: Settings, destination: str | None, window_s: int) -> dict[str, Any]:
    """The figures of ``status --json``: one key per job status (``waiting``: the pending ones
    waiting in their key's chain in ordered mode, in ``waiting_chains`` chains, the oldest stored
    ``oldest_waiting_s`` ago; ``stuck_chains`` of them wait for a head the scheduler no longer has, the
    oldest record for ``oldest_stuck_s``; ``held``, 0.4's name of ``waiting``, is deprecated), plus
    dead reasons, lateness, ``breakers``: the destinations' breakers not closed or with jobs paused
    (and the destination's, with ``destination``), and ``topics_at_risk``: the service's own topics
    whose records one broker's loss would take (one replica on a cluster of more brokers), with why
    (``""``: Kafka did not answer within 3 s, nothing was checked)."""
    from retry_scheduler.ops.status import read_status, topics_at_risk

    reading, breakers = read_status(settings.database_url, destination, window_s)
    late, waiting, overdue, vacuum = reading.lateness, reading.waiting, reading.oldest_overdue, reading.vacuum
    report: dict[str, Any] = {s.value: reading.counts.get(s.value, 0) for s in Status}
    report["waiting"] = waiting.waiting
    report["held"] = waiting.waiting  # deprecated: 0.4's name of "waiting", gone in the next release
    report["waiting_chains"] = waiting.chains
    report["oldest_waiting_s"] = waiting.oldest_waiting_s
    report["stuck_chains"] = waiting.stuck
    report["oldest_stuck_s"] = waiting.oldest_stuck_s
    report["dead_by_reason"] = reading.dead_by_reason
    report["oldest_overdue"] = (
        None
        if overdue is None
        else {
            "id": overdue.id,
            "destination": overdue.destination,
            "due_at": overdue.due_at.isoformat(),
            "overdue_s": round(overdue.overdue_s, 3),
        }
    )
    report["lateness"] = {
        "window_s": window_s,
        "published": late.count,
        "p50_s": late.p50_s,
        "p99_s": late.p99_s,
        "max_s": late.max_s,
        "early": late.early,
    }
    report["vacuum"] = {
        "autovacuum": vacuum.autovacuum,
        "dead_rows": vacuum.dead_rows,
        "live_rows": vacuum.live_rows,
        "last_vacuum": vacuum.last_vacuum.isoformat() if vacuum.last_vacuum else None,
    }
    report["breakers"] = [
        b.as_dict() for b in breakers if destination is None or b.destination == destination
    ]
    report["destination"] = destination
    report["topics_at_risk"] = topics_at_risk(settings)
    return report


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


def _cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    report = status_report(settings, args.destination, args.window)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    scope = f" for destination {args.destination}" if args.destination else ""
    print(f"retry jobs{scope}")
    for status in Status:
        line = f"  {status.value:<10} {report[status.value]:>10}"
        if status is Status.PENDING and report["waiting"]:
            line += (
                f"  ({report['waiting']} waiting behind an earlier record of their key, in "
                f"{report['waiting_chains']} chain(s), the oldest for {_fmt_s(report['oldest_waiting_s'])})"
            )
            if report["stuck_chains"]:
                line += (
                    f"\n{'':<24}({report['stuck_chains']} chain(s) wait for a head the scheduler no longer "
                    f"has, the oldest for {_fmt_s(report['oldest_stuck_s'])}: `retry-scheduler chains list`)"
                )
        if status is Status.DEAD and report["dead_by_reason"]:
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(report["dead_by_reason"].items()))
            line += f"  ({reasons})"
        print(line)
    for b in report["breakers"]:
        if b["state"] != "closed" or b["paused"]:
            print(
                f"  breaker {b['destination']}: {b['state']} since {b['since']}, {b['paused']} job(s) paused"
                + (f": {b['reason']}" if b["reason"] else "")
            )
    overdue = report["oldest_overdue"]
    print(
        "  oldest overdue: none"
        if overdue is None
        else f"  oldest overdue: job {overdue['id']} for {overdue['destination']}, "
        f"due {overdue['due_at']} ({overdue['overdue_s']}s ago)"
    )
    late = report["lateness"]
    print(
        f"  lateness, last {late['window_s']}s: {late['published']} published, p50 {_fmt_s(late['p50_s'])}, "
        f"p99 {_fmt_s(late['p99_s'])}, max {_fmt_s(late['max_s'])}, early {late['early']}"
    )
    for topic, why in report["topics_at_risk"].items():
        print(f"  warning: topic {topic}: {why}" if topic else f"  warning: topics not checked: {why}")
    vacuum = report["vacuum"]
    if not vacuum["autovacuum"]:
        print(
            f"  warning: autovacuum is off on this PostgreSQL server; retry_jobs has {vacuum['dead_rows']:,} dead "
            "rows: the publish loop vacuums it itself (RETRY_SELF_VACUUM, on unless set to false), a "
            "minute apart at least; turn autovacuum on (the default) to leave it to the server"
        )
    return 0


def _cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    """Run the ingest and publish loops outside Airflow (debugging, benchmarks, chaos tests)."""
    from retry_scheduler.core.deployment import Deployment
    from retry_scheduler.loops.kafka import require_reachable
    from retry_scheduler.loops.runners import run_ingest, run_publish
    from retry_scheduler.ops.status import require_database

    if args.grace is not None:
        settings = settings.with_overrides(loop_grace_ms=round(args.grace * 1000))
    # What a first run gets wrong, said in one line before any loop starts (exit 2).
    deployment = Deployment.load(settings)
    require_database(settings.database_url)
    require_reachable(settings)

    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def body(name: str) -> None:
        try:
            fn = run_ingest if name == "ingest" else run_publish
            results[name] = fn(args.seconds, deployment)
        except BaseException as exc:
            errors.append(exc)
            log.exception("%s loop failed", name)

    loops = ["ingest", "publish"] if args.only is None else [args.only]
    threads = [threading.Thread(target=body, args=(name,), name=name) for name in loops]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(results, indent=2, default=str))
    return 1 if errors else 0


def add_parsers(sub: Any) -> None:
    """Register ``db``, ``status`` and ``run``."""
    db = sub.add_parser("db", help="database schema")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    migrate = db_sub.add_parser("migrate", help="apply pending migrations (idempotent)")
    migrate.add_argument("--json", action="store_true", help="machine-readable output")
    migrate.set_defaults(func=_cmd_migrate)

    status = sub.add_parser("status", help="jobs by status, oldest overdue job, lateness")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--destination", metavar="TOPIC", help="only jobs for this destination")
    status.add_argument(
        "--window",
        type=seconds,
        default=300,
        metavar="DURATION",
        help=f"lateness window (5m): {DURATION_HELP}",
    )
    status.set_defaults(func=_cmd_status)

    run = sub.add_parser("run", help="run the ingest and publish loops without Airflow")
    run.add_argument("--seconds", type=float, default=60, metavar="S", help="how long to loop (default 60)")
    run.add_argument("--only", choices=["ingest", "publish"], help="run one loop only")
    run.add_argument(
        "--grace",
        type=float,
        metavar="S",
        help="once --seconds are up, carry on until a newer loop of the same kind is alive, for at most S "
        "seconds, as the DAG's loops hand over (default: RETRY_LOOP_GRACE_MS, 60 s; 0 stops on time)",
    )
    run.set_defaults(func=_cmd_run)
