"""``retry-scheduler policies check``: validate a policies module and say what it declares."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retry_scheduler.core.config import Settings
from retry_scheduler.core.durations import format_duration_ms

if TYPE_CHECKING:
    from retry_scheduler.core.policy import PolicyRegistry


def _declared(paths: list[Path]) -> dict[str, Any]:
    """What the modules declare, checked as the loops check them at start (PolicyError otherwise)."""
    from retry_scheduler.core.policy import load_policies, load_policies_module

    registry = load_policies(paths)
    channels: list[Any] = []
    for path in paths:
        declared = getattr(load_policies_module(path), "ALERT_CHANNELS", [])
        channels += declared if isinstance(declared, list | tuple) else []
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
        "file": ", ".join(map(str, paths)),
        "files": [str(p) for p in paths],
        "policies": policies,
        "destinations": [_resolved(registry, d.pattern) for d in registry.declarations],
        "allowed_destinations": [getattr(a, "pattern", a) for a in registry.allowed],
        "alert_channels": [type(c).__name__ for c in channels],
    }


def _resolved(registry: PolicyRegistry, pattern: str) -> dict[str, Any]:
    """A declared destination's rules as they resolve (a name takes what a glob sets and it does not),
    and which declaration each came from."""
    from retry_scheduler.core.declarations import RULE_FIELDS
    from retry_scheduler.core.policy import DEFAULT_POLICY

    rules = registry.declarations.rules(pattern)
    if not rules.declared:  # a glob: its own declaration
        [own] = [d for d in registry.declarations if d.pattern == pattern]
        found = {f: getattr(own, f) for f in RULE_FIELDS if getattr(own, f) is not None}
        sources = dict.fromkeys(found, pattern)
    else:
        found = {f: rules.value(f) for f in rules.sources}
        sources = dict(rules.sources)
    return {
        "destination": pattern,
        "policy": found.get("policy") or DEFAULT_POLICY,
        "rate_limit": found.get("rate_limit"),
        "breaker": found["breaker"].describe() if found.get("breaker") else None,
        **{f: v for f, v in found.items() if f not in RULE_FIELDS},
        "from": {f: p for f, p in sources.items() if p != pattern},
        "allows": any(d.allow for d in registry.declarations if d.pattern == pattern),
    }


def _cmd_check(args: argparse.Namespace, settings: Settings) -> int:
    if args.file:  # as RETRY_POLICIES would name them: modules and folders
        settings = settings.with_overrides(policies_path=",".join(args.file))
    declared = _declared(settings.policies_files)  # a PolicyError is one line, exit 2 (cli.main)
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
    for d in declared["destinations"]:
        came = d["from"]
        said = [f"policy {d['policy']}" + (f" (from {came['policy']})" if "policy" in came else "")]
        if d["rate_limit"] is not None:
            rate_from = f" (from {came['rate_limit']})" if "rate_limit" in came else ""
            said.append(f"at most {d['rate_limit']:,g} records/s{rate_from}")
        if d["breaker"] is not None:
            said.append(
                f"breaker {d['breaker']}" + (f" (from {came['breaker']})" if "breaker" in came else "")
            )
        if not d["allows"]:
            said.append("rules only (allow=False: it allows no topic)")
        print(f"  destination {d['destination']}: {'; '.join(said)}")
    regexes = [
        a
        for a in declared["allowed_destinations"]
        if a not in {d["destination"] for d in declared["destinations"]}
    ]
    if regexes:
        print(f"  also allowed (patterns): {', '.join(map(str, regexes))}")
    if not declared["destinations"] and not regexes:
        print(
            "  destinations: none declared (a retry may go nowhere but where RETRY_DESTINATION_ALLOWLIST says)"
        )
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
        description="Import the modules as the loops do at start (one, or one per team: a destination or a "
        "policy declared by two is an error naming both) and check every declaration; print their "
        "policies, each declared destination with its rules as they resolve (a topic takes what a glob "
        "matching it sets and it does not), the other allowed destinations and the alert channels, or one "
        "line saying what is wrong and where (exit 2).",
    )
    check.add_argument(
        "file",
        nargs="*",
        help="the modules, or folders of retry_policies*.py, put together as the loops would (default: "
        "those the loops would load: RETRY_POLICIES, else retry_policies.py beside the DAGs)",
    )
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.set_defaults(func=_cmd_check)
