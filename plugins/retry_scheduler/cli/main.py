# PYTHON_ARGCOMPLETE_OK
"""``retry-scheduler``: the command line of the retry and dead-letter service.

Shell completion (bash, zsh): ``eval "$(register-python-argcomplete retry-scheduler)"``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from retry_scheduler import __version__
from retry_scheduler.cli import breakers, chains, dev, dlq, harness, policies, service, spark
from retry_scheduler.core.config import ConfigError, Settings


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: global options, then one command group per module of this package."""
    parser = argparse.ArgumentParser(
        prog="retry-scheduler",
        description="Delayed retries and dead letters for Kafka, run by Apache Airflow, kept in PostgreSQL.",
        epilog="Environment: RETRY_DATABASE_URL, KAFKA_BOOTSTRAP_SERVERS, AIRFLOW_HOME, RETRY_POLICIES "
        "and the RETRY_* settings (docs/configuration.md); the global options override them. "
        "Times and durations: an ISO-8601 time (UTC without a zone) or a duration ago; durations like "
        '90s, 15m, 2h, 7d. Completion: eval "$(register-python-argcomplete retry-scheduler)".',
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
    sub = parser.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")
    for group in (service, policies, spark, dlq, chains, breakers, dev, harness):
        group.add_parsers(sub)
    _list_apart(parser, sub, DEVELOPMENT, "development and measurement (from a checkout or the dev extra)")
    return parser


#: Commands for working on the service rather than operating it: listed apart in ``--help``.
DEVELOPMENT = ("dev", "demo", "bench", "chaos")


def _list_apart(parser: argparse.ArgumentParser, sub: Any, names: tuple[str, ...], title: str) -> None:
    """Show the commands ``names`` under a heading of their own in ``--help`` (parsing is unchanged)."""
    apart = [action for action in sub._choices_actions if action.dest in names]
    sub._choices_actions[:] = [action for action in sub._choices_actions if action.dest not in names]
    group = parser.add_argument_group(title)
    group._group_actions.extend(apart)


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
    parser = build_parser()
    try:
        import argcomplete
    except ImportError:  # the SDK-only install has no command line dependencies
        pass
    else:
        argcomplete.autocomplete(parser)  # answers the shell's completion request and exits, if one
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from retry_scheduler.core.policy import PolicyError
    from retry_scheduler.db.connection import StoreError
    from retry_scheduler.db.selection import SelectionError
    from retry_scheduler.dev.procs import DevStackError
    from retry_scheduler.loops.kafka import KafkaUnreachableError
    from retry_scheduler.spark.jdbc import JobArgumentError

    try:
        return int(args.func(args, settings_from_args(args)))
    except (
        ConfigError, StoreError, JobArgumentError, DevStackError, SelectionError, KafkaUnreachableError,
        PolicyError,
    ) as exc:  # fmt: skip
        print(f"retry-scheduler: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
