"""The bulk retry job's command line: its options, parsed and checked before anything runs.

The connections come from the connection file or the environment
(:mod:`retry_scheduler.spark.connection_file`), never from the command line.
"""

from __future__ import annotations

import argparse
import getpass
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from retry_scheduler.cli.selection_args import add_selection_arguments, selection_from_args
from retry_scheduler.core.config import Settings
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.rates import RateError, parse_rate
from retry_scheduler.db.selection import Selection, SelectionError
from retry_scheduler.loops.kafka import producer_config
from retry_scheduler.spark.connection_file import add_connection_options, job_settings
from retry_scheduler.spark.selection import RUN_ID, BulkRetryError

#: Acknowledged jobs marked published per transaction, by default.
MARK_BATCH = 10_000


def producer_settings(bootstrap_servers: str, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The normal publish path's producer settings (idempotent, ``acks=all``), batching a little more."""
    kafka = {"linger.ms": 20, **extra, "bootstrap.servers": bootstrap_servers}
    return producer_config(Settings(kafka=kafka))


@dataclass(frozen=True)
class Options:
    """The bulk retry's parsed arguments. What may hold a password (the database URL, the Kafka
    settings) is left out of ``repr``, and so of any log line or traceback that shows the options."""

    database_url: str = field(repr=False)
    bootstrap_servers: str
    selection: Selection
    dry_run: bool
    partitions: int
    fetchsize: int | None
    kafka_config: dict[str, Any] = field(repr=False)
    producer_conf: dict[str, Any] = field(repr=False)
    run_id: str
    #: The deployment, asked for each destination's rules: the jobs of a destination it does not
    #: allow are left as they are; one whose rate limit is below ``rate_per_s`` goes at its limit.
    deployment: Deployment = field(repr=False)
    mark_batch: int = MARK_BATCH
    #: Who asked, and from where (``cli`` or ``dag``), for the audit row.
    actor: str = "cli"
    source: str = "cli"
    #: At most this many jobs of each destination published per second, shared evenly by the job's
    #: partitions (None: not paced).
    rate_per_s: float | None = None


def _positive(name: str, top: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, not {raw!r}") from None
        if not 1 <= value <= top:
            raise argparse.ArgumentTypeError(f"{name} must be between 1 and {top}")
        return value

    return parse


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="bulk_retry.py", description="Re-publish a filtered set of retry jobs to their destinations."
    )
    add_connection_options(parser)
    add_selection_arguments(parser, status=True, for_job=True)
    parser.add_argument("--dry-run", action="store_true", help="count per destination, publish nothing")
    parser.add_argument("--partitions", type=_positive("--partitions", 10_000), default=8)
    parser.add_argument(
        "--fetchsize",
        type=_positive("--fetchsize", 1_000_000),
        help="rows per JDBC round trip (default: up to 10000, fewer for large records, 64 MiB at most)",
    )
    parser.add_argument(
        "--mark-batch",
        type=_positive("--mark-batch", 1_000_000),
        default=MARK_BATCH,
        help=f"acknowledged jobs marked published per transaction (default: {MARK_BATCH}); after a crash "
        "at most a few batches per running partition are published again",
    )
    parser.add_argument(
        "--rate",
        metavar="N",
        help="publish at most N jobs of each destination per second, the job's partitions sharing it "
        "(default, or 0: not paced)",
    )
    parser.add_argument("--run-id", help="name of this run, in its logs and result (default: a new uuid)")
    parser.add_argument("--actor", help="who asked, for the audit row (default: cli:<OS user>)")
    parser.add_argument("--source", choices=["cli", "dag"], default="cli", help="where the run was asked for")
    args = parser.parse_args(argv)
    settings = job_settings(args)
    kafka_config = {k: v for k, v in settings.kafka.items() if k != "bootstrap.servers"}
    run_id = args.run_id or str(uuid.uuid4())
    if not RUN_ID.fullmatch(run_id):
        raise BulkRetryError("--run-id must be 1-128 characters of [A-Za-z0-9._:-]")
    try:
        selection = selection_from_args(args, settings)
        rate = parse_rate(args.rate)
    except (SelectionError, RateError) as exc:
        raise BulkRetryError(str(exc)) from None
    deployment = Deployment.load(settings)
    return Options(
        database_url=settings.database_url,
        bootstrap_servers=settings.bootstrap_servers,
        selection=selection,
        dry_run=args.dry_run,
        partitions=args.partitions,
        fetchsize=args.fetchsize,
        kafka_config=kafka_config,
        producer_conf=producer_settings(settings.bootstrap_servers, kafka_config),
        run_id=run_id,
        deployment=deployment,
        mark_batch=args.mark_batch,
        actor=args.actor or f"cli:{getpass.getuser()}",
        source=args.source,
        rate_per_s=rate or None,
    )
