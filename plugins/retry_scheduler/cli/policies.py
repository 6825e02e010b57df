"""``retry-scheduler policies check``: validate a policies module and say what it declares."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from retry_scheduler.core.config import Settings
from retry_scheduler.core.durations import format_duration_ms


def _declared(path: Path) -> dict[str, Any]:
    """What the module declares, checked as the loops check it at start (PolicyError otherwise)."""
    from retry_scheduler.core.policy import load_policies, load_policies_module

    registry = load_policies(path)
    module = load_policies_module(path)
    channels = getattr(module, "ALERT_CHANNELS", [])
    policies = []
    for policy in sorted(registry.policies.values(), key=lambda p: p.name):
        if policy.backoff is not None:
            b = policy.backoff
            schedule = f"backoff {b.base} x{b.factor:g} up to {b.max}" + (
                f", jitter {b.jitter:g}" if b.jitter else ""
            )
        else:
            schedule = "delays " + ", ".join(
                format_duration_ms(policy.delay_ms(n)) for n in range(len(policy.delays or ()))
            )
        policies.append(
            {
                "name": policy.name,
                "schedule": schedule,
                "max_attempts": policy.max_attempts,
                "max_age": None if policy.max_age_ms is None else format_duration_ms(policy.max_age_ms),
                "fatal_errors": sorted(policy.fatal_errors),
                "dlq_topic": policy.dlq_topic,
            }
        )
    return {
        "file": str(path),
        "policies": policies,
        "destinations": dict(sorted(registry.destinations.items())),
        "allowed_destinations": [getattr(a, "pattern", a) for a in registry.allowed],
        "rate_limits": dict(registry.rate_limits),
        "breakers": {pattern: breaker.describe() for pattern, breaker in registry.breakers},
        "alert_channels": [type(c).__name__ for c in channels] if isinstance(channels, list | tuple) else [],
    }


def _cmd_check(args: argparse.Namespace, settings: Settings) -> int:
    path = Path(args.file) if args.file else settings.policies_file
    declared = _declared(path)  # a PolicyError is one line, exit 2 (cli.main)
    if args.json:
        print(json.dumps(declared, indent=2))
        return 0
    print(f"{declared['file']}: valid")
    for p in declared["policies"]:
        extra = f", max age {p['max_age']}" if p["max_age"] else ""
        fatal = f", fatal {', '.join(p['fatal_errors'])}" if p["fatal_errors"] else ""
        print(
            f"  policy {p['name']}: {p['schedule']}; at most {p['max_attempts']} retries{extra}{fatal}; DLQ {p['dlq_topic']}"
        )
    for topic, name in declared["destinations"].items():
        print(f"  destination {topic} -> policy {name}")
    allowed = ", ".join(map(str, declared["allowed_destinations"])) or "(none besides the destinations above)"
    print(f"  allowed destinations: {allowed}")
    for pattern, rate in declared["rate_limits"].items():
        print(f"  rate limit {pattern}: at most {rate:,g} records/s")
    for pattern, breaker in declared["breakers"].items():
        print(f"  breaker {pattern}: {breaker}")
    channels = ", ".join(declared["alert_channels"]) or "(none: the built-in webhook, e-mail and log only)"
    print(f"  alert channels: {channels}")
    return 0


def add_parsers(sub: Any) -> None:
    """Register ``policies``."""
    policies = sub.add_parser(
        "policies",
        help="check a retry policies module",
        description="Retry policies are declared in Python, in retry_policies.py beside the DAGs (or where "
        "RETRY_POLICIES says).",
    )
    policies_sub = policies.add_subparsers(dest="policies_command", required=True, metavar="ACTION")
    check = policies_sub.add_parser(
        "check",
        help="validate a policies module and print what it declares",
        description="Import the module as the loops do at start and check every declaration; print its "
        "policies, destinations, allowed destinations and alert channels, or one line saying what is "
        "wrong and where (exit 2).",
    )
    check.add_argument("file", nargs="?", help="the module (default: the one the loops would load)")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.set_defaults(func=_cmd_check)
