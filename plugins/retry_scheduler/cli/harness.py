"""``bench`` and ``chaos``: the harness of the repository's ``bench/``, run from a checkout."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from retry_scheduler.core.config import ConfigError, Settings


def harness_module(name: str) -> ModuleType:
    """Import ``bench.NAME`` from the repository checkout in the current directory.

    The benchmark and chaos harness are not installed with the package: they drive it from outside.
    """
    root = Path.cwd()
    if not (root / "bench" / "__init__.py").is_file():
        raise ConfigError(
            "the benchmark and chaos harness ship with the repository, not the package: run this from "
            "the root of a kafka-retry-scheduler checkout (make bench, make chaos)"
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(f"bench.{name}")


def _cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    """Measure the service against baselines run in the same run; write the report."""
    measure = harness_module("measure")
    BenchError, main = measure.BenchError, measure.main

    try:
        return main(settings, args)
    except BenchError as exc:
        print(f"retry-scheduler bench: {exc}", file=sys.stderr)
        return 2


def _cmd_chaos(args: argparse.Namespace, settings: Settings) -> int:
    """Fault-injection trials and the bad-input corpus on a private PostgreSQL and broker."""
    chaos = harness_module("chaos")
    ChaosError, run_chaos = chaos.ChaosError, chaos.run_chaos
    if args.cluster and args.postgres_failover:
        print(
            "retry-scheduler chaos: --cluster and --postgres-failover are runs of their own", file=sys.stderr
        )
        return 2
    run = "--cluster" if args.cluster else "--postgres-failover" if args.postgres_failover else ""
    known = {"--cluster": chaos.CLUSTER_FAULTS, "--postgres-failover": chaos.FAILOVER_FAULTS}.get(
        run, chaos.FAULTS
    )
    faults = tuple(filter(None, (f.strip() for f in (args.faults or "").split(",")))) or known
    unknown = sorted(set(faults) - set(known))
    if unknown:
        flag = f" with {run}" if run else ""
        print(
            f"retry-scheduler chaos: unknown fault kind(s) {', '.join(unknown)} (known{flag}: {', '.join(known)})",
            file=sys.stderr,
        )
        return 2
    try:
        report = run_chaos(
            trials=args.trials,
            seed=args.seed,
            records=args.records,
            out_dir=Path(args.out),
            bad_input=not (args.no_bad_input or args.cluster or args.postgres_failover),
            faults=faults,
            cluster=args.cluster,
            postgres_failover=args.postgres_failover,
        )
    except ChaosError as exc:
        print(f"retry-scheduler chaos: {exc}", file=sys.stderr)
        return 2
    keys = ("trials", "messages", "lost", "duplicates", "duplicates_unidentified", "bad_input_kinds",
            "bad_input_lost", "duration_s")  # fmt: skip
    print(json.dumps({k: report[k] for k in keys}))
    return 0 if report["passed"] else 1


def _rates(text: str) -> tuple[int, ...]:
    try:
        rates = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of rates like 1000,2000,5000") from None
    if not rates or any(r < 1 for r in rates) or list(rates) != sorted(set(rates)):
        raise argparse.ArgumentTypeError(f"{text!r}: give rising rates of at least 1, like 1000,2000,5000")
    return rates


def _send_rate(text: str) -> int:
    try:
        rate = int(text)
    except ValueError:
        rate = -1
    if rate < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give records a second (0 or more; 0: no limit)")
    return rate


def add_parsers(sub: Any) -> None:
    """Register ``bench`` and ``chaos``."""
    bench = sub.add_parser(
        "bench",
        help="measure throughput, lateness and claim cost against baselines; write bench/out/report.*",
        description="Create a throwaway database (retry_bench) on the server of RETRY_DATABASE_URL and start "
        "the dev broker (Apache Kafka 4.4) on a free port, run each measurement through the service's own code with its "
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
        help="comma-separated subset of: "
        "ingest, publish, claim, spark, lateness, capacity, held_snapshot, burst, soak, ordered, fairness, "
        "handover "
        "(default: all)",
    )
    bench.add_argument("--out", default="bench/out", metavar="DIR", help="report directory (bench/out)")
    _add_size_options(bench)
    bench.add_argument("--db-name", default="retry_bench", help="the throwaway database (retry_bench)")
    bench.add_argument(
        "--keep-db",
        action="store_true",
        help="keep the database and the stacks' Airflow homes and logs (a temporary directory, named at "
        "the end) afterwards, to look at them; a run that fails keeps the logs too",
    )
    bench.add_argument(
        "--json", action="store_true", help="print report.json's content on stdout (the narrative on stderr)"
    )
    bench.set_defaults(func=_cmd_bench)
    _add_chaos_parser(sub)


def _add_size_options(bench: Any) -> None:
    """``bench``'s options that change a measurement's sizes (bench.sizes.Sizes)."""
    bench.add_argument("--ingest-records", type=int, metavar="N", help="records to ingest (500000)")
    bench.add_argument(
        "--publish-rows", type=int, metavar="N", help="due jobs to publish, also PgQueuer's (100000)"
    )
    bench.add_argument("--naive-rows", type=int, metavar="N", help="due jobs for the naive poller (5000)")
    bench.add_argument("--claim-rows", type=int, metavar="N", help="rows of the large claim table (10000000)")
    bench.add_argument("--lateness-seconds", type=int, metavar="S", help="length of the lateness run (300)")
    bench.add_argument(
        "--capacity-rates",
        type=_rates,
        metavar="R,R",
        help="retry rates (records/s) the capacity measurement steps through, lowest first, until one "
        "is not sustained (1000,1500,2000,2500,3000,4000,5000,7500,10000,12500)",
    )
    bench.add_argument(
        "--capacity-seconds", type=int, metavar="S", help="how long each capacity rate is held (300)"
    )
    bench.add_argument(
        "--held-rate",
        type=int,
        metavar="R",
        help="records/s of the held-snapshot windows: alone, with a snapshot held open, beside a Spark bulk retry (5000)",
    )
    bench.add_argument(
        "--held-seconds", type=int, metavar="S", help="how long each held-snapshot window lasts (600)"
    )
    bench.add_argument(
        "--held-spark-rows",
        type=int,
        metavar="N",
        help="dead jobs the third held-snapshot window bulk-retries through Spark beside the loop; 0 leaves "
        "that window out (1000000)",
    )
    bench.add_argument(
        "--burst-records",
        type=int,
        metavar="N",
        help="records of the burst, sent while steady traffic goes on (1000000)",
    )
    bench.add_argument(
        "--burst-rate",
        type=_send_rate,
        metavar="N",
        help="records a second the burst is sent at; 0: as fast as one producer can (32000)",
    )
    bench.add_argument("--soak-rate", type=int, metavar="R", help="records/s of the soak (5000)")
    bench.add_argument("--soak-seconds", type=int, metavar="S", help="how long the soak lasts (1800)")


def _add_chaos_parser(sub: Any) -> None:
    """``chaos``: the fault-injection harness's options."""
    chaos = sub.add_parser(
        "chaos",
        help="fault injection: kill -9 workers and bulk jobs, freeze the broker, restart PostgreSQL; "
        "count lost records",
        description="Start a private PostgreSQL and broker, send a bad-input corpus to a running service, "
        "then run trials that each send a workload and inject one fault at a random point; after recovery "
        "count lost and duplicate records. Writes chaos.json; exits 1 unless nothing was lost.",
    )
    chaos.add_argument("--trials", type=int, default=100, metavar="N", help="fault trials (100)")
    chaos.add_argument("--records", type=int, default=2500, metavar="N", help="records per trial (2500)")
    chaos.add_argument("--seed", type=int, metavar="S", help="random seed (printed; random by default)")
    chaos.add_argument("--out", default="bench/out", metavar="DIR", help="where chaos.json goes (bench/out)")
    chaos.add_argument("--no-bad-input", action="store_true", help="skip the bad-input corpus")
    chaos.add_argument(
        "--cluster",
        action="store_true",
        help="the trials of a Kafka cluster failing (leaders, coordinator and controller killed, rolling "
        "restart, two brokers down, a broker frozen) on three brokers and two controllers only; written "
        "as the cluster entry of chaos.json (no bad-input corpus)",
    )
    chaos.add_argument(
        "--postgres-failover",
        action="store_true",
        help="the trials of the PostgreSQL primary killed -9 (while ingesting, while publishing, and after "
        "its replica was cut off: the last commits lost) and the replica promoted, on a primary and a "
        "streaming replica; written as the failover entry of chaos.json (no bad-input corpus)",
    )
    chaos.add_argument(
        "--faults",
        metavar="KIND,KIND",
        help="only these fault kinds, e.g. bulk_retry_kill,compaction_kill (default: every kind)",
    )
    chaos.set_defaults(func=_cmd_chaos)
