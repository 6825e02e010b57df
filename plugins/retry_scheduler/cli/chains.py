"""``retry-scheduler chains``: list ordered mode's chains with records waiting, and release the stuck ones."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from typing import Any

from retry_scheduler.core.config import Settings


def _cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.ops.chains import list_chains

    chains = list_chains(settings.database_url, limit=args.limit, stuck=args.stuck)
    if args.json:
        print(json.dumps([c.as_dict() for c in chains], indent=2))
        return 0
    if not chains:
        print("no chain has records waiting" if not args.stuck else "no chain is stuck")
        return 0
    print(
        f"{'chain':<36}  {'waiting':>7}  {'waited':>9}  {'state':<8}  head pending  destination / key / group"
    )
    for c in chains:
        key = "-" if c.key is None else c.key.decode("utf-8", "backslashreplace")[:40]
        print(
            f"{c.chain[:36]:<36}  {c.waiting:>7}  {c.waited_s:>8.0f}s  {c.state or '-':<8}  "
            f"{'yes' if c.head_pending else 'NO (stuck)' if c.stuck else 'no':<12}  "
            f"{c.destination} / {key} / {c.group or '-'}"
        )
    if any(c.stuck for c in chains):
        print(
            "\nA stuck chain waits for a head the scheduler no longer has: its retry was published and the "
            "consumer group has not released it (is it running, reading that topic?), or the head is lost. "
            "`retry-scheduler chains release CHAIN` lets it go as if the head had died."
        )
    return 0


def _cmd_release(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.ops.chains import release

    if not args.yes:
        print(
            "retry-scheduler: not confirmed: add --yes to release these chains (their heads' pending "
            "retries go dead, their records are published in order as if their heads had died)",
            file=sys.stderr,
        )
        return 2
    done = release(
        settings.database_url,
        args.chains,
        why="its chain was released by an operator" + (f" ({args.why})" if args.why else ""),
        actor=f"cli:{getpass.getuser()}",
        source="cli",
    )
    out: dict[str, Any] = {
        "released": done.chains,
        "heads_dead": done.heads_dead,
        "not_waiting": done.unknown,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"released {len(done.chains)} chain(s); {len(done.heads_dead)} pending head(s) made dead")
        for chain in done.unknown:
            print(f"  {chain}: nothing waiting in it (finished, going out already, or never was)")
    return 0 if done.chains or not done.unknown else 1


def add_parsers(sub: Any) -> None:
    """Register ``chains list`` and ``chains release``."""
    chains = sub.add_parser(
        "chains",
        help="ordered mode's chains: list them, release the stuck ones",
        description="A chain is the records of one key waiting behind a failed record (its head) in "
        "ordered mode. See docs/operations/runbook.md, 'Waiting chains'.",
    )
    chains_sub = chains.add_subparsers(dest="chains_command", required=True, metavar="ACTION")
    listing = chains_sub.add_parser("list", help="the chains with records waiting, the longest waiting first")
    listing.add_argument(
        "--stuck", action="store_true", help="only the chains whose head the scheduler no longer has"
    )
    listing.add_argument("--limit", type=int, default=100, metavar="N", help="chains at most (100)")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(func=_cmd_list)
    release = chains_sub.add_parser(
        "release",
        help="let chains go as if their heads had died",
        description="The head's retry, if still pending, goes dead (to its DLQ topic, replayable); the "
        "chain's records are published in their order with retry.chain-state: dead:<head>, and the "
        "consumer helper handles or dead-letters them (its after_dead). Audited (dlq audit).",
    )
    release.add_argument("chains", nargs="+", metavar="CHAIN", help="chain ids (chains list)")
    release.add_argument("--why", metavar="TEXT", help="a note kept in the dead heads' reason")
    release.add_argument("--yes", action="store_true", help="do it (required)")
    release.add_argument("--json", action="store_true", help="machine-readable output")
    release.set_defaults(func=_cmd_release)
