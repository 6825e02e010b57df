"""``retry-scheduler``: the command line of the retry and dead-letter service."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from retry_scheduler import __version__
from retry_scheduler.cli import dev, dlq, harness, service, spark
from retry_scheduler.core.config import ConfigError, Settings


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: global options, then one command group per module of this package."""
    parser = argparse.ArgumentParser(
        prog="retry-scheduler",
        description="Delayed retries and dead letters for Kafka, run by Apache Airflow, kept in PostgreSQL.",
        epilog="Environment: RETRY_DATABASE_URL, KAFKA_BOOTSTRAP_SERVERS, AIRFLOW_HOME, RETRY_POLICIES "
        "and the RETRY_* settings (see the README, Configuration). The options below override them.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="PostgreSQL of the retry jobs, postgresql://USER@HOST:PORT/DB (RETRY_DATABASE_URL); "
        "prefer PGPASSWORD or ~/.pgpass for the password: a URL on the command line shows in ps",
    )
    parser.add_argument(
        "--kafka-bootstrap", metavar="HOST:PORT", help="Kafka bootstrap servers (KAFKA_BOOTSTRAP_SERVERS)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (service, dev, spark, dlq, harness):
        group.add_parsers(sub)
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from the environment, with the global options on top."""
    settings = Settings.from_env()
    if args.database_url:
        settings = settings.with_overrides(database_url=args.database_url)
    if args.kafka_bootstrap:
        settings = settings.with_overrides(
            kafka={**settings.kafka, "bootstrap.servers": args.kafka_bootstrap}
        )
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; exit status 0 done, 1 the command's own failure, 2 a usage or setup error."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from retry_scheduler.db.connection import StoreError
    from retry_scheduler.dev.stack import DevStackError
    from retry_scheduler.ops.dlq import DlqError
    from retry_scheduler.spark.jdbc import JobArgumentError

    try:
        return int(args.func(args, settings_from_args(args)))
    except (ConfigError, StoreError, JobArgumentError, DevStackError, DlqError) as exc:
        print(f"retry-scheduler: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
