"""``retry-scheduler breakers``: the destinations' breakers (``BREAKERS``); open or close one by hand."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from typing import Any, Literal

from retry_scheduler.core.config import Settings


def _cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.core.deployment import Deployment
    from retry_scheduler.ops.breakers import list_breakers

    registry = Deployment.load(settings).policies
    listed = list_breakers(settings.database_url, declared_in=registry)
    if args.json:
        print(json.dumps([b.as_dict() for b in listed], indent=2))
        return 0
    if not registry.any("breaker"):
        print("no breaker is declared (Destination(..., breaker=Breaker()) in the policies module)")
    if not listed:
        return 0
    print(f"{'destination':<32}  {'state':<8}  {'paused':>7}  {'opened':>6}  since / why")
    for b in listed:
        since = "-" if b.since is None else b.since.isoformat(timespec="seconds")
        print(
            f"{b.destination[:32]:<32}  {b.state:<8}  {b.paused:>7}  {b.trips:>6}  {since}"
            + (f": {b.reason}" if b.reason else "")
        )
    return 0


def _cmd_set(args: argparse.Namespace, settings: Settings) -> int:
    from retry_scheduler.core.deployment import Deployment
    from retry_scheduler.ops.breakers import set_breakers

    registry = Deployment.load(settings).policies
    undeclared = [d for d in args.destinations if not registry.has_breaker(d)]
    if undeclared:
        print(
            f"retry-scheduler: {', '.join(undeclared)} has no breaker: declare one in the policies module "
            f"first, e.g. DESTINATIONS = [Destination({undeclared[0]!r}, breaker=Breaker())]",
            file=sys.stderr,
        )
        return 2
    state: Literal["open", "closed"] = "open" if args.breakers_command == "open" else "closed"
    if not args.yes:
        what = (
            "pause their due jobs until you close them (no probe goes out)"
            if state == "open"
            else "let their paused jobs go now, without a probe"
        )
        print(f"retry-scheduler: not confirmed: add --yes to {args.breakers_command} these breakers ({what})",
              file=sys.stderr)  # fmt: skip
        return 2
    who = f"cli:{getpass.getuser()}"
    why = f"{'opened' if state == 'open' else 'closed'} by {who}" + (f": {args.why}" if args.why else "")
    done = set_breakers(settings.database_url, args.destinations, state, why=why, who=who)
    out: dict[str, Any] = {"state": state, "destinations": done}
    print(json.dumps(out, indent=2) if args.json else f"{len(done)} breaker(s) {state}: {', '.join(done)}")
    return 0


def add_parsers(sub: Any) -> None:
    """Register ``breakers list``, ``breakers open`` and ``breakers close``."""
    breakers = sub.add_parser(
        "breakers",
        help="the destinations' breakers: list them, open or close one by hand",
        description="A destination's breaker (BREAKERS in the policies module) pauses its due jobs while the "
        "records sent to it fail or come back. See docs/operations/runbook.md, 'Breakers'.",
    )
    breakers_sub = breakers.add_subparsers(dest="breakers_command", required=True, metavar="ACTION")
    listing = breakers_sub.add_parser(
        "list",
        help="the breakers not closed or with jobs paused, and every declared one the service has seen",
    )
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(func=_cmd_list)
    for action, text in (
        ("open", "pause the destinations' due jobs until closed by hand (maintenance)"),
        ("close", "let the destinations' paused jobs go now, without waiting for a probe"),
    ):
        p = breakers_sub.add_parser(action, help=text, description=text + ". The publish loop acts on it "
                                    "within a second.")  # fmt: skip
        p.add_argument("destinations", nargs="+", metavar="DESTINATION", help="destination topics")
        p.add_argument("--why", metavar="TEXT", help="a note kept as the breaker's reason")
        p.add_argument("--yes", action="store_true", help="do it (required)")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=_cmd_set)
