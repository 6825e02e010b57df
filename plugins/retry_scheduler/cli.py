"""``retry-scheduler``: the command line of the retry and dead-letter service."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from collections.abc import Sequence
from typing import Any

from retry_scheduler.config import ConfigError, Settings
from retry_scheduler.jobs import Status

log = logging.getLogger("retry_scheduler")


def _cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.store import migrate

    applied = migrate(settings.database_url)
    print(f"applied {len(applied)} migration(s): {', '.join(applied)}" if applied else "schema is up to date")
    return 0


def status_report(settings: Settings, destination: str | None, window_s: int) -> dict[str, Any]:
    """The figures of ``status --json``: one key per job status, plus dead reasons and lateness."""
    from retry_scheduler.store import Store

    with Store(settings.database_url) as store:
        raw = store.status(destination=destination, window_s=window_s)
    late = raw["lateness"]
    report: dict[str, Any] = {s.value: int(raw["counts"].get(s.value, 0)) for s in Status}
    report["dead_by_reason"] = raw["dead_by_reason"]
    report["oldest_overdue"] = raw["oldest_overdue"]
    report["lateness"] = {
        "window_s": window_s,
        "published": late.count,
        "p50_s": late.p50_s,
        "p99_s": late.p99_s,
        "max_s": late.max_s,
        "early": late.early,
    }
    report["destination"] = destination
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
        if status is Status.DEAD and report["dead_by_reason"]:
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(report["dead_by_reason"].items()))
            line += f"  ({reasons})"
        print(line)
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
    return 0


def _dlq_filter(args: argparse.Namespace) -> Any:
    from retry_scheduler.dlq import DlqFilter

    return DlqFilter.from_params(
        {
            "destination": args.destination,
            "dead_reason": args.dead_reason,
            "error_class": args.error_class,
            "search": args.search,
            "since": args.since,
            "until": args.until,
            "ids": getattr(args, "ids", None),
            "limit": getattr(args, "limit", None),
        }
    )


def _cmd_dlq_list(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.dlq import list_dead, to_json

    page = list_dead(settings.database_url, _dlq_filter(args), page_size=args.page_size, cursor=args.cursor)
    if args.json:
        print(to_json(page.as_json()))
        return 0
    total = f"{page.total}+" if page.total_capped else str(page.total)
    print(f"{total} dead job(s) match; newest first")
    if page.jobs:
        print(
            f"{'id':>10}  {'dead at (UTC)':<19}  {'destination':<24} {'reason':<9} {'error class':<28} reason"
        )
    for job in page.jobs:
        print(
            f"{job.id:>10}  {job.dead_at.strftime('%Y-%m-%d %H:%M:%S'):<19}  {job.destination or '-':<24} "
            f"{job.dead_reason:<9} {(job.error_class or '-')[:28]:<28} {(job.reason or '')[:60]!r}"
        )
    if page.next_cursor:
        print(f"more: retry-scheduler dlq list ... --cursor {page.next_cursor}")
    return 0


def _cmd_dlq_show(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.dlq import show, to_json

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

    from retry_scheduler.dlq import run_action, to_json

    flt = _dlq_filter(args)
    actor = f"cli:{getpass.getuser()}"
    reset = bool(getattr(args, "reset_attempts", False))
    plan = run_action(
        settings.database_url,
        args.dlq_command,
        flt,
        actor=actor,
        source="cli",
        dry_run=True,
        reset_attempts=reset,
    )
    print(to_json(plan.as_json()) if args.json else plan.summary())
    if args.dry_run or plan.would_affect == 0:
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            print(
                f"retry-scheduler: not confirmed: add --yes to {args.dlq_command} these jobs "
                "(or --dry-run to only count)",
                file=sys.stderr,
            )
            return 2
        answer = input(f"{args.dlq_command} {plan.would_affect} dead job(s)? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing done")
            return 1

    def progress(done: int, total: int) -> None:
        print(f"  {done}/{total}", file=sys.stderr)

    outcome = run_action(
        settings.database_url,
        args.dlq_command,
        flt,
        actor=actor,
        source="cli",
        dry_run=False,
        reset_attempts=reset,
        progress=progress,
    )
    print(to_json(outcome.as_json()) if args.json else outcome.summary())
    return 0


def _cmd_dlq_audit(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.dlq import recent_audit, to_json

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
    return 0


def _cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    """Run the ingest and publish loops outside Airflow (debugging, benchmarks, chaos tests)."""
    from retry_scheduler.airflow_tasks import run_ingest, run_publish

    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def body(name: str) -> None:
        try:
            fn = run_ingest if name == "ingest" else run_publish
            results[name] = fn(args.seconds, settings)
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


#: DAGs that run all the time; ``dev up`` unpauses them (Airflow creates every DAG paused).
ALWAYS_ON_DAGS = ("retry_scheduler", "retry_monitor")


def _cmd_dev_up(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.airflow_api import api_token, unpause_dag
    from retry_scheduler.devstack import DevStack

    with DevStack(settings) as stack:
        if not args.paused:
            token = api_token(stack.base_url)
            for dag_id in ALWAYS_ON_DAGS:
                unpause_dag(stack.base_url, token, dag_id)
            print(f"Unpaused {', '.join(ALWAYS_ON_DAGS)}: the service is running (Ctrl-C stops everything)")
        stack.wait()
    return 0


def _cmd_dev_postgres(args: argparse.Namespace, settings: Settings) -> int:
    """Make sure PostgreSQL answers at RETRY_DATABASE_URL; start one from the machine's binaries if not."""
    from retry_scheduler.config import REPO_ROOT
    from retry_scheduler.devstack import ensure_postgres

    proc = ensure_postgres(settings.database_url, REPO_ROOT / ".dev" / "postgres")
    if proc is None:
        print("PostgreSQL answers at RETRY_DATABASE_URL")
    else:
        # Left running in its own session for the commands that follow (make test); pid printed to stop it.
        print(f"started PostgreSQL (pid {proc.pid}, data in .dev/postgres); stop it with: kill {proc.pid}")
    return 0


def _cmd_dev_spark_archive(args: argparse.Namespace, settings: Settings) -> int:
    """Write the Spark driver's class-data sharing archive (``sparkjobs.class_archive()``) if missing.

    Two warm-up jobs: the first leaves the archive as its JVM exits, the second must start with
    ``-Xshare:on`` from it (a JVM that cannot map it refuses to start) before it is put in place.
    """
    import tempfile
    import time

    from retry_scheduler.sparkjobs import WARM_UP_APP, archive_complete, class_archive, stale_class_archives

    archive = class_archive()
    if archive is None:
        print("no class archive: RETRY_SPARK_CLASS_ARCHIVE=off, or no java on PATH (make spark-deps)")
        return 0
    if archive_complete(archive) and not args.force:
        print(f"class archive up to date: {archive}")
        return 0
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f".{archive.name}.partial")
    partial.unlink(missing_ok=True)
    print(f"writing the class archive of Spark's driver (two small warm-up jobs, about a minute): {archive}")
    # The JVM archives every class the warm-up loaded as it exits; its notes on the classes it cannot
    # archive (generated ones) are noise here, hence -Xlog:cds=off.
    dump = f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds=off -Xlog:cds+dynamic=off"
    with tempfile.TemporaryDirectory(prefix="retry-warm-up-") as scratch:
        code = _spark_submit(str(WARM_UP_APP), [scratch], conf={"spark.driver.defaultJavaOptions": dump})
        if code == 0 and partial.is_file():
            began = time.perf_counter()
            code = _spark_submit(
                str(WARM_UP_APP), [scratch],
                conf={"spark.driver.defaultJavaOptions": f"-Xshare:on -XX:SharedArchiveFile={partial}"},
            )  # fmt: skip
            took = time.perf_counter() - began
    if code != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        print(
            f"no class archive: the warm-up job exited {code} (output above); Spark jobs start without one",
            file=sys.stderr,
        )
        return code or 1
    size = partial.stat().st_size
    archive.with_suffix(".json").write_text(json.dumps({"bytes": size}) + "\n")
    partial.replace(archive)
    for stale in stale_class_archives(archive):  # 170 MiB each
        stale.unlink(missing_ok=True)
    print(f"class archive written: {archive} ({size / 2**20:.0f} MiB); the warm-up took {took:.1f} s with it")
    return 0


def _cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.demo import run_demo

    return run_demo(settings, records=args.records, timeout_s=args.timeout)


def _spark_submit(app: str, job_args: list[str], conf: dict[str, str] | None = None) -> int:
    """Run a job of include/spark with spark-submit in local mode; its progress goes to stderr.

    ``conf`` replaces the default ``--conf`` of every job (``sparkjobs.spark_conf()``).
    """
    import os
    import subprocess
    from pathlib import Path

    from retry_scheduler.config import REPO_ROOT
    from retry_scheduler.sparkjobs import jdbc_jars, spark_conf, spark_packages

    spark_submit = Path(sys.executable).parent / "spark-submit"
    cmd = [
        str(spark_submit),
        "--master",
        os.environ.get("RETRY_SPARK_MASTER", "local[*]"),
        "--conf",
        "spark.log.level=WARN",
    ]
    for key, value in (spark_conf() if conf is None else conf).items():
        cmd += ["--conf", f"{key}={value}"]
    if jars := jdbc_jars():
        cmd += ["--jars", jars]
    if packages := spark_packages():
        cmd += ["--packages", packages]
    env = dict(os.environ)
    # spark-submit finds Spark through the venv's python; the job's Python workers use the same one.
    env["PATH"] = os.pathsep.join(filter(None, [str(spark_submit.parent), env.get("PATH")]))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT / "plugins"), env.get("PYTHONPATH")]))
    # The job's progress is shown live on stderr; its counts come last on stdout as one JSON object.
    result: str | None = None
    with subprocess.Popen([*cmd, app, *job_args], env=env, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{") and _is_json_object(line):
                result = line.strip()
            else:
                sys.stderr.write(line)
    if result is not None:
        print(result)
    return proc.returncode


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _cmd_bulk_retry(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.sparkjobs import BULK_RETRY_APP, bulk_retry_args

    params = {
        "destination": args.destination,
        "status": args.status,
        "error_class": args.error_class,
        "since": args.since,
        "until": args.until,
        "limit": args.limit,
        "dry_run": args.dry_run,
    }
    return _spark_submit(str(BULK_RETRY_APP), bulk_retry_args(params, settings))


def _cmd_compact(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.sparkjobs import COMPACT_APP, compact_args

    job_args = compact_args(
        settings,
        older_than=args.older_than,
        archive=args.archive,
        dead_retention=args.dead_retention,
        dry_run=args.dry_run,
    )
    return _spark_submit(str(COMPACT_APP), job_args)


def _cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    """Measure the service against baselines run in the same run; write the report."""
    from retry_scheduler.bench import BenchError, main

    try:
        return main(settings, args)
    except BenchError as exc:
        print(f"retry-scheduler bench: {exc}", file=sys.stderr)
        return 2


def _cmd_chaos(args: argparse.Namespace, settings: Settings) -> int:
    """Fault-injection trials and the bad-input corpus on a private PostgreSQL and broker."""
    from pathlib import Path

    from retry_scheduler.chaos import ChaosError, run_chaos

    try:
        report = run_chaos(
            trials=args.trials,
            seed=args.seed,
            records=args.records,
            out_dir=Path(args.out),
            bad_input=not args.no_bad_input,
        )
    except ChaosError as exc:
        print(f"retry-scheduler chaos: {exc}", file=sys.stderr)
        return 2
    keys = ("trials", "messages", "lost", "duplicates", "duplicates_unidentified", "bad_input_kinds",
            "bad_input_lost", "duration_s")  # fmt: skip
    print(json.dumps({k: report[k] for k in keys}))
    return 0 if report["passed"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="retry-scheduler",
        description="Delayed retries and dead letters for Kafka, run by Apache Airflow, kept in PostgreSQL.",
        epilog="Environment: RETRY_DATABASE_URL, KAFKA_BOOTSTRAP_SERVERS, AIRFLOW_HOME (see README).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    db = sub.add_parser("db", help="database schema")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    db_sub.add_parser("migrate", help="apply pending migrations (idempotent)").set_defaults(func=_cmd_migrate)

    dev = sub.add_parser("dev", help="embedded development stack")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True, metavar="ACTION")
    up = dev_sub.add_parser(
        "up",
        help="run broker, PostgreSQL and Airflow in the foreground until Ctrl-C",
        description="Start the embedded Kafka-protocol broker on localhost:9092, make sure PostgreSQL "
        "answers (starting one from the machine's binaries if needed), migrate, run Airflow "
        "(UI on http://localhost:8080, login admin/admin) and unpause the retry_scheduler and "
        "retry_monitor DAGs, until Ctrl-C.",
    )
    up.add_argument("--paused", action="store_true", help="leave every DAG paused (Airflow's default)")
    up.set_defaults(func=_cmd_dev_up)
    dev_sub.add_parser(
        "postgres", help="make sure PostgreSQL answers at RETRY_DATABASE_URL (start one if not)"
    ).set_defaults(func=_cmd_dev_postgres)
    spark_archive = dev_sub.add_parser(
        "spark-archive",
        help="write the class archive that makes Spark jobs start faster (make spark-deps runs it)",
        description="Run a small Spark job once with -XX:ArchiveClassesAtExit, leaving a Java class-data "
        "sharing archive in .dev/spark/ (or RETRY_SPARK_CLASS_ARCHIVE) that every later bulk-retry and "
        "compaction driver maps instead of loading Spark's classes again. Nothing to do when it exists.",
    )
    spark_archive.add_argument("--force", action="store_true", help="write it again even if it exists")
    spark_archive.set_defaults(func=_cmd_dev_spark_archive)

    demo = sub.add_parser(
        "demo",
        help="run an end-to-end scenario under the real Airflow scheduler",
        description="Bring the dev stack up, send a mixed workload (recovering, exhausting, fatal and "
        "malformed records), wait for every record's outcome, print a summary and stop the stack.",
    )
    demo.add_argument("--records", type=int, default=200, help="records in the workload (default 200)")
    demo.add_argument("--timeout", type=float, default=600, help="seconds to wait for the outcome")
    demo.set_defaults(func=_cmd_demo)

    status = sub.add_parser("status", help="jobs by status, oldest overdue job, lateness")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--destination", metavar="TOPIC", help="only jobs for this destination")
    status.add_argument("--window", type=int, default=300, metavar="SECONDS", help="lateness window (300)")
    status.set_defaults(func=_cmd_status)

    bulk = sub.add_parser(
        "bulk-retry",
        help="re-publish a large filtered set of jobs with PySpark (same job as the retry_bulk_replay DAG)",
        description="Select jobs by destination, status, error class and time window and publish them "
        "back to their destinations with Spark (local mode). Try --dry-run first: it only counts.",
    )
    bulk.add_argument("--destination", metavar="TOPIC", help="only jobs for this destination")
    bulk.add_argument("--status", choices=["dead", "pending"], default="dead", help="which jobs (dead)")
    bulk.add_argument("--error-class", metavar="GLOB", help="glob on the error class, e.g. '*Timeout*'")
    bulk.add_argument("--since", metavar="TIME", help="failed at or after this ISO-8601 time")
    bulk.add_argument("--until", metavar="TIME", help="failed before this ISO-8601 time")
    bulk.add_argument("--limit", type=int, metavar="N", help="at most N jobs, oldest first")
    bulk.add_argument("--dry-run", action="store_true", help="only count the selected jobs")
    bulk.set_defaults(func=_cmd_bulk_retry)

    compact = sub.add_parser(
        "compact",
        help="archive processed jobs to Parquet and delete them (same job as the retry_compaction DAG)",
        description="Archive published jobs, and dead jobs past their retention, processed more than "
        "--older-than ago, to Parquet partitioned by day and destination; verify the archive, then delete "
        "those rows from PostgreSQL in bounded batches.",
    )
    compact.add_argument(
        "--older-than", default="7d", metavar="DURATION", help="processed before now - this (7d)"
    )
    compact.add_argument("--archive", metavar="URI", help="local directory or Hadoop URI (RETRY_ARCHIVE_URI)")
    compact.add_argument(
        "--dead-retention", default="30d", metavar="DURATION", help="keep dead jobs this long (30d)"
    )
    compact.add_argument("--dry-run", action="store_true", help="only count what would be archived")
    compact.set_defaults(func=_cmd_compact)

    _add_dlq_parser(sub)

    bench = sub.add_parser(
        "bench",
        help="measure throughput, lateness and claim cost against baselines; write bench/out/report.*",
        description="Create a throwaway database (retry_bench) on the server of RETRY_DATABASE_URL and start "
        "an embedded broker on a free port, run each measurement through the service's own code with its "
        "baseline in the same run (ingest vs PostgreSQL COPY, publish vs PgQueuer and a naive poller, claim "
        "cost with 10 million rows vs 10 000, PySpark bulk retry and compaction, lateness under the Airflow "
        "scheduler), then write report.json, report.md and PNG plots and print a table. Exits 1 when a "
        "measured figure misses its target (never with --quick).",
    )
    bench.add_argument(
        "--quick", action="store_true", help="small sizes (as in make test): no evidence for the targets"
    )
    bench.add_argument(
        "--only",
        metavar="NAMES",
        help="comma-separated subset of: ingest, publish, claim, spark, lateness (default: all)",
    )
    bench.add_argument("--out", default="bench/out", metavar="DIR", help="report directory (bench/out)")
    bench.add_argument("--ingest-records", type=int, metavar="N", help="records to ingest (500000)")
    bench.add_argument(
        "--publish-rows", type=int, metavar="N", help="due jobs to publish, also PgQueuer's (100000)"
    )
    bench.add_argument("--naive-rows", type=int, metavar="N", help="due jobs for the naive poller (5000)")
    bench.add_argument("--claim-rows", type=int, metavar="N", help="rows of the large claim table (10000000)")
    bench.add_argument("--lateness-seconds", type=int, metavar="S", help="length of the lateness run (300)")
    bench.add_argument("--db-name", default="retry_bench", help="the throwaway database (retry_bench)")
    bench.add_argument("--keep-db", action="store_true", help="keep the database afterwards, to look at it")
    bench.set_defaults(func=_cmd_bench)

    run = sub.add_parser("run", help="run the ingest and publish loops without Airflow")
    run.add_argument("--seconds", type=float, default=60, help="how long to loop (default 60)")
    run.add_argument("--only", choices=["ingest", "publish"], help="run one loop only")
    run.set_defaults(func=_cmd_run)

    chaos = sub.add_parser(
        "chaos",
        help="fault injection: kill -9 workers, freeze the broker, restart PostgreSQL; count lost records",
        description="Start a private PostgreSQL and broker, send a bad-input corpus to a running service, "
        "then run trials that each send a workload and inject one fault at a random point; after recovery "
        "count lost and duplicate records. Writes chaos.json; exits 1 unless nothing was lost.",
    )
    chaos.add_argument("--trials", type=int, default=100, metavar="N", help="fault trials (100)")
    chaos.add_argument("--records", type=int, default=2500, metavar="N", help="records per trial (2500)")
    chaos.add_argument("--seed", type=int, metavar="S", help="random seed (printed; random by default)")
    chaos.add_argument("--out", default="bench/out", metavar="DIR", help="where chaos.json goes (bench/out)")
    chaos.add_argument("--no-bad-input", action="store_true", help="skip the bad-input corpus")
    chaos.set_defaults(func=_cmd_chaos)
    return parser


def _add_dlq_filters(parser: argparse.ArgumentParser, *, for_action: bool) -> None:
    from retry_scheduler import protocol

    parser.add_argument("--destination", metavar="TOPIC", help="only dead jobs for this destination")
    parser.add_argument("--dead-reason", choices=protocol.DEAD_REASONS, help="only this dead reason")
    parser.add_argument("--error-class", metavar="GLOB", help="glob on the error class, e.g. '*Timeout*'")
    parser.add_argument("--search", metavar="TEXT", help="text in the reason or error class (any case)")
    parser.add_argument(
        "--since", metavar="TIME", help="went dead at or after this ISO-8601 time, or this long ago (2h)"
    )
    parser.add_argument(
        "--until", metavar="TIME", help="went dead before this ISO-8601 time, or this long ago"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    if for_action:
        parser.add_argument("--ids", metavar="ID,ID", help="only these job ids")
        parser.add_argument("--limit", type=int, metavar="N", help="at most N jobs, oldest first")
        parser.add_argument("--dry-run", action="store_true", help="only count (and audit the dry run)")
        parser.add_argument("--yes", action="store_true", help="do it without asking (after the dry run)")


def _add_dlq_parser(sub: Any) -> None:
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

    replay = dlq_sub.add_parser(
        "replay",
        help="make dead jobs due now; the publish loop sends them to their destination",
        description="Select dead jobs by filter or --ids, show the dry run, and after confirmation make "
        "them due now with their attempt kept (or reset with --reset-attempts). Invalid jobs are left "
        "alone: their headers named no usable destination.",
    )
    _add_dlq_filters(replay, for_action=True)
    replay.add_argument(
        "--reset-attempts", action="store_true", help="start the policy's schedule again (attempt 0)"
    )
    replay.set_defaults(func=_cmd_dlq_act)

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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from retry_scheduler.devstack import DevStackError
    from retry_scheduler.dlq import DlqError
    from retry_scheduler.sparkjobs import JobArgumentError
    from retry_scheduler.store import StoreError

    try:
        settings = Settings.from_env()
        return int(args.func(args, settings))
    except (ConfigError, StoreError, JobArgumentError, DevStackError, DlqError) as exc:
        print(f"retry-scheduler: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
