"""Dev tooling commands: ``dev up|postgres|spark-archive|spark-cluster`` and ``demo``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from retry_scheduler.core.config import Settings, dev_home

#: ``dev up --executor``: DevStack.EXECUTORS (the stack module is not imported for --help).
EXECUTORS = ("local", "celery")
#: DAGs that run all the time; ``dev up`` unpauses them (Airflow creates every DAG paused).
ALWAYS_ON_DAGS = ("retry_scheduler", "retry_monitor")


def _cmd_dev_up(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.dev.airflow_api import api_token, unpause_dag
    from retry_scheduler.dev.stack import DevStack

    with DevStack(
        settings, executor=args.executor, celery_workers=args.celery_workers, kafka_brokers=args.kafka_brokers
    ) as stack:
        if not args.paused:
            token = api_token(stack.base_url)
            for dag_id in ALWAYS_ON_DAGS:
                unpause_dag(stack.base_url, token, dag_id)
            print(f"Unpaused {', '.join(ALWAYS_ON_DAGS)}: the service is running (Ctrl-C stops everything)")
        stack.wait()
    return 0


def _cmd_dev_postgres(args: argparse.Namespace, settings: Settings) -> int:
    """Make sure PostgreSQL answers at RETRY_DATABASE_URL; start one from the machine's binaries if not."""
    from retry_scheduler.dev.postgres import ensure_postgres

    proc = ensure_postgres(settings.database_url, dev_home() / "postgres")
    if proc is None:
        print("PostgreSQL answers at RETRY_DATABASE_URL")
    else:
        # Left running in its own session for the commands that follow (make test); pid printed to stop it.
        print(
            f"started PostgreSQL (pid {proc.pid}, data in {dev_home() / 'postgres'}); stop it with: kill {proc.pid}"
        )
    return 0


def _cmd_dev_kafka_deps(args: argparse.Namespace, settings: Settings) -> int:
    """Fetch the dev broker's jars (Apache Kafka 4.4 and log4j2) from Maven Central into the cache."""
    from retry_scheduler.dev.kafka_libs import fetch_kafka_libs, libs_complete, libs_dir

    if libs_complete():
        print(f"Apache Kafka's jars are in {libs_dir()}")
        return 0
    print(f"Apache Kafka's jars fetched into {fetch_kafka_libs()}")
    return 0


def _cmd_dev_clean(args: argparse.Namespace, settings: Settings) -> int:
    """Remove the databases and folders the dev tooling made for this dev home (a listing without --yes)."""
    from retry_scheduler.dev.clean import clean

    clean(settings.database_url, dev_home(), yes=args.yes, everything=args.all)
    return 0


def _cmd_dev_spark_archive(args: argparse.Namespace, settings: Settings) -> int:
    """Write the Spark driver's class-data sharing archive (``spark.archive.class_archive()``) if missing.

    Two warm-up jobs: the first leaves the archive as its JVM exits, the second must start with
    ``-Xshare:on`` from it (a JVM that cannot map it refuses to start) before it is put in place.
    """
    import tempfile
    import time

    from retry_scheduler.spark.class_archive import archive_complete, class_archive, stale_class_archives
    from retry_scheduler.spark.submit import WARM_UP_APP, run_spark_submit

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
        code = run_spark_submit(WARM_UP_APP, [scratch], conf={"spark.driver.defaultJavaOptions": dump})
        if code == 0 and partial.is_file():
            began = time.perf_counter()
            code = run_spark_submit(
                WARM_UP_APP, [scratch],
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


def _cmd_dev_spark_cluster(args: argparse.Namespace, settings: Settings) -> int:
    """A Spark standalone cluster in the foreground until Ctrl-C (jobs: --master URL)."""
    import time

    from retry_scheduler.dev.spark_cluster import start_cluster

    work_dir = dev_home() / "spark-cluster"
    with start_cluster(
        work_dir, workers=args.workers, cores=args.cores, memory=args.memory, say=print
    ) as cluster:
        print(
            f"Submit jobs with --master {cluster.url} (or RETRY_SPARK_MASTER={cluster.url}); Ctrl-C stops it",
            flush=True,
        )
        try:
            while all(proc.poll() is None for _name, proc in cluster.procs):
                time.sleep(1)
        except KeyboardInterrupt:
            return 0
    print("a Spark process of the cluster exited; logs in " + str(work_dir), file=sys.stderr)
    return 1


def _cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.dev.demo import run_demo

    # --json: the summary as JSON on stdout, the narrative on stderr
    output: dict[str, Any] = (
        {"say": lambda line: print(line, file=sys.stderr, flush=True), "json_out": sys.stdout}
        if args.json
        else {}
    )
    return run_demo(settings, records=args.records, timeout_s=args.timeout, executor=args.executor, **output)


def add_parsers(sub: Any) -> None:
    """Register ``dev`` and ``demo``."""
    dev = sub.add_parser("dev", help="embedded development stack")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True, metavar="ACTION")
    up = dev_sub.add_parser(
        "up",
        help="run broker, PostgreSQL and Airflow in the foreground until Ctrl-C",
        description="Start the dev broker (Apache Kafka 4.4, its data in .dev/kafka) on localhost:9092 "
        "unless one answers there (KAFKA_BOOTSTRAP_SERVERS), make sure PostgreSQL "
        "answers (starting one from the machine's binaries if needed), migrate, run Airflow "
        "(UI on http://localhost:8080, login admin/admin) and unpause the retry_scheduler and "
        "retry_monitor DAGs, until Ctrl-C.",
    )
    up.add_argument("--paused", action="store_true", help="leave every DAG paused (Airflow's default)")
    up.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="local",
        help="where tasks run: the scheduler's LocalExecutor (default), or Celery workers with Redis as "
        "the broker (RETRY_DEV_REDIS_URL, default redis://127.0.0.1:6379/0, started here if none answers)",
    )
    up.add_argument("--celery-workers", type=int, default=1, metavar="N", help="Celery workers (1)")
    up.add_argument(
        "--kafka-brokers",
        type=int,
        default=1,
        metavar="N",
        help="a Kafka cluster of N brokers on this machine instead of the one dev broker (3: topics "
        "with three replicas and min.insync.replicas 2, two more nodes as controllers only); 1 by default",
    )
    up.set_defaults(func=_cmd_dev_up)
    dev_sub.add_parser(
        "postgres", help="make sure PostgreSQL answers at RETRY_DATABASE_URL (start one if not)"
    ).set_defaults(func=_cmd_dev_postgres)
    dev_sub.add_parser(
        "kafka-deps",
        help="fetch the dev broker's jars (Apache Kafka 4.4) from Maven Central, once (make kafka-deps)",
        description="Copy Apache Kafka 4.4.0 and a log4j2 backend, pinned in the package's "
        "dev/kafka/pom.xml, from Maven Central into RETRY_KAFKA_LIBS or "
        "~/.cache/kafka-retry-scheduler/ with Maven (mvn). The dev stack, the demo and the tests do it "
        "on first use; nothing to do when they are there.",
    ).set_defaults(func=_cmd_dev_kafka_deps)
    clean = dev_sub.add_parser(
        "clean",
        help="remove the databases and folders make up and make demo created (lists them without --yes)",
        description="Remove what the dev tooling created for this dev home (RETRY_DEV_HOME, default "
        "./.dev): the databases on the server of RETRY_DATABASE_URL commented as made for it (the dev "
        "stack's Airflow metadata database, retry_scheduler_dev_airflow unless RETRY_DEV_METADATA_DB "
        "names another; the migrated template; the retry database when the dev tooling created it), and "
        "the folders airflow/, logs/, postgres/ (stopping the PostgreSQL the tooling started there), "
        "spark-cluster/ and archive/ of the dev home. A database without that comment is never touched. "
        "Without --yes it only lists them. Refused while something is connected to one of the databases.",
    )
    clean.add_argument("--yes", action="store_true", help="remove them (without it: only list them)")
    clean.add_argument(
        "--all", action="store_true", help="the Spark class archive (.dev/spark, from make spark-deps) too"
    )
    clean.set_defaults(func=_cmd_dev_clean)
    spark_archive = dev_sub.add_parser(
        "spark-archive",
        help="write the class archive that makes Spark jobs start faster (make spark-deps runs it)",
        description="Run a small Spark job once with -XX:ArchiveClassesAtExit, leaving a Java class-data "
        "sharing archive in .dev/spark/ (or RETRY_SPARK_CLASS_ARCHIVE) that every later bulk-retry and "
        "compaction driver maps instead of loading Spark's classes again. Nothing to do when it exists.",
    )
    spark_archive.add_argument("--force", action="store_true", help="write it again even if it exists")
    spark_archive.set_defaults(func=_cmd_dev_spark_archive)
    cluster = dev_sub.add_parser(
        "spark-cluster",
        help="run a Spark standalone cluster (a master and workers) in the foreground until Ctrl-C",
        description="Start Spark's standalone master and workers from the installed pyspark, each a JVM "
        "of its own on 127.0.0.1 (logs and work directories in .dev/spark-cluster/), and print the "
        "spark:// URL for bulk-retry and compact --master (or the spark_default connection).",
    )
    cluster.add_argument("--workers", type=int, default=1, help="workers (1)")
    cluster.add_argument("--cores", type=int, default=2, help="cores each worker offers (2)")
    cluster.add_argument("--memory", default="2g", help="memory each worker offers (2g)")
    cluster.set_defaults(func=_cmd_dev_spark_cluster)
    _add_demo_parser(sub)


def _add_demo_parser(sub: Any) -> None:
    """``demo``: the end-to-end scenario under the real scheduler."""
    demo = sub.add_parser(
        "demo",
        help="run an end-to-end scenario under the real Airflow scheduler",
        description="Bring the dev stack up, send a mixed workload (recovering, exhausting, fatal and "
        "malformed records), wait for every record's outcome, print a summary and stop the stack.",
    )
    demo.add_argument("--records", type=int, default=200, help="records in the workload (default 200)")
    demo.add_argument("--timeout", type=float, default=600, help="seconds to wait for the outcome")
    demo.add_argument(
        "--json",
        action="store_true",
        help="the summary as one JSON object on stdout (the narrative on stderr)",
    )
    demo.add_argument(
        "--executor", choices=EXECUTORS, default="local", help="where the DAG's tasks run (local, or celery)"
    )
    demo.set_defaults(func=_cmd_demo)
