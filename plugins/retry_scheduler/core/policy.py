"""Retry policies: when a failed record is retried, and when it is dead.

Policies are declared in Python, in one module next to the DAGs (``dags/retry_policies.py``),
and reviewed like code::

    from retry_scheduler import Backoff, Breaker, Destination, Policy

    POLICIES = [
        Policy("default", delays=["10s", "1m", "5m"], max_attempts=3, max_age="1d"),
        Policy("payments", backoff=Backoff(base="1s", factor=2, max="10m", jitter=0.2),
               max_attempts=8, fatal_errors=["InvalidCardError"], dlq_topic="payments.dlq"),
    ]
    DESTINATIONS = [   # one declaration per destination (:mod:`retry_scheduler.core.declarations`)
        Destination("payments", policy="payments", rate_limit=200, breaker=Breaker(failure_rate=0.5)),
        Destination("orders"), Destination("shop.*"),   # allowed; nothing else is
    ]
    ALERT_CHANNELS = [SlackWebhookNotifier(slack_webhook_conn_id="slack", text="{{ alert.summary() }}")]

Everything here is a pure function of its inputs (the clock is a parameter), so the
strategy is tested with a frozen clock and tables of cases.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from retry_scheduler.core import protocol
from retry_scheduler.core.breakers import Breaker, BreakerError
from retry_scheduler.core.declarations import (
    DeclarationError,
    Declarations,
    Destination,
    DestinationRules,
    from_dicts,
    regexes,
)
from retry_scheduler.core.destinations import Allowed, DestinationRuleError, Destinations
from retry_scheduler.core.durations import parse_duration_ms

DEFAULT_POLICY = "default"
DEFAULT_DLQ_TOPIC = "retry.dlq"


class PolicyError(ValueError):
    """A policy declaration is wrong; the message names the policy and the field."""


class UnknownPolicyError(LookupError):
    """A record names a policy that is not declared."""


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: ``base * factor**attempt``, capped at ``max``, spread by ``jitter``.

    ``jitter`` is a fraction (0.2 = +/-20 %). The spread is derived from the job's ``retry.id``
    and attempt, so the same failure always gets the same due time (re-ingestion is stable).
    """

    base: str | float = "1s"
    factor: float = 2.0
    max: str | float = "1h"
    jitter: float = 0.0
    _base_ms: int = field(init=False, repr=False, compare=False)
    _max_ms: int = field(init=False, repr=False, compare=False)

    #: What is wrong with it, said by the policy that uses it (which names itself), or None.
    problem: str | None = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Not raised here: the Backoff is built before its Policy, whose error can name the policy.
        problem = None
        if not _number(self.factor) or self.factor < 1:
            problem = f"backoff factor must be a number >= 1, not {self.factor!r}"
        elif not _number(self.jitter) or not 0 <= self.jitter <= 1:
            problem = f"backoff jitter must be a number from 0 to 1, not {self.jitter!r}"
        base_ms = max_ms = 0
        try:
            # Parsed once: delay_ms runs for every record ingested.
            base_ms, max_ms = parse_duration_ms(self.base), parse_duration_ms(self.max)
        except (TypeError, ValueError) as exc:
            problem = problem or f"backoff {exc}"
        object.__setattr__(self, "problem", problem)
        object.__setattr__(self, "_base_ms", base_ms)
        object.__setattr__(self, "_max_ms", max_ms)

    def delay_ms(self, attempt: int, spread: float) -> int:
        base, cap = self._base_ms, self._max_ms
        # Cap the exponent first: factor**attempt overflows floats for large attempts.
        raw = float(cap) if attempt > 64 else min(float(cap), base * self.factor**attempt)
        jittered = raw * (1 + self.jitter * (2 * spread - 1))
        return int(min(cap, max(0.0, jittered)))


@dataclass(frozen=True)
class Decision:
    """What to do with one failed record: retry at ``due_ms``, or dead for ``dead_reason``."""

    due_ms: int
    dead_reason: str | None = None


@dataclass(frozen=True)
class Policy:
    """A named retry policy.

    Give either ``delays`` (a schedule: attempt n waits ``delays[n]``, the last entry repeats)
    or ``backoff``. ``max_attempts`` counts retries: a record that already had that many is
    dead (``exhausted``). ``max_age`` bounds the time since the first failure (``expired``).
    ``fatal_errors`` lists exception classes that are dead at once (``fatal``); a name matches
    the class exactly or as the last dotted part (``ValueError`` matches ``builtins.ValueError``).
    """

    name: str
    delays: Sequence[str | float] | None = None
    backoff: Backoff | None = None
    max_attempts: int = 5
    max_age: str | float | None = None
    fatal_errors: Iterable[str] = ()
    dlq_topic: str = DEFAULT_DLQ_TOPIC
    _delays_ms: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _max_age_ms: int | None = field(init=False, repr=False, compare=False)
    _fatal: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise PolicyError(f"a policy needs a name (a non-empty string), not {self.name!r}")
        self._check_types()
        if (self.delays is None) == (self.backoff is None):
            raise PolicyError(
                f"policy {self.name!r}: give exactly one of delays=[...] or backoff=Backoff(...)"
            )
        try:
            delays = tuple(parse_duration_ms(d) for d in (self.delays or ()))
            max_age_ms = None if self.max_age is None else parse_duration_ms(self.max_age)
        except ValueError as exc:
            raise PolicyError(f"policy {self.name!r}: {exc}") from None
        if self.delays is not None and not delays:
            raise PolicyError(f"policy {self.name!r}: delays must not be empty")
        if self.max_attempts < 0:
            raise PolicyError(f"policy {self.name!r}: max_attempts must be >= 0")
        if not self.dlq_topic:
            raise PolicyError(f"policy {self.name!r}: dlq_topic must not be empty")
        object.__setattr__(self, "_delays_ms", delays)
        object.__setattr__(self, "_max_age_ms", max_age_ms)  # parsed once: decide() runs per record
        object.__setattr__(self, "_fatal", frozenset(self.fatal_errors))

    def _check_types(self) -> None:
        """What a declaration in Python gets wrong without an error of its own: ``max_attempts="3"``, a
        string where a list belongs (``fatal_errors="ValueError"`` would be split into letters)."""
        name = self.name
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise PolicyError(
                f"policy {name!r}: max_attempts must be a whole number, not {self.max_attempts!r}"
            )
        if isinstance(self.delays, str | bytes) or (
            self.delays is not None and not isinstance(self.delays, Sequence)
        ):
            raise PolicyError(
                f"policy {name!r}: delays must be a list, e.g. ['10s', '1m'], not {self.delays!r}"
            )
        if isinstance(self.fatal_errors, str | bytes) or not isinstance(self.fatal_errors, Iterable):
            raise PolicyError(
                f"policy {name!r}: fatal_errors must be a list of exception class names, e.g. "
                f"['ValueError'], not {self.fatal_errors!r}"
            )
        bad = [e for e in self.fatal_errors if not isinstance(e, str) or not e]
        if bad:
            raise PolicyError(
                f"policy {name!r}: fatal_errors holds {bad[0]!r}: each entry is an exception class name"
            )
        if not isinstance(self.dlq_topic, str) or (
            self.dlq_topic and not protocol.TOPIC_NAME.fullmatch(self.dlq_topic)
        ):
            raise PolicyError(f"policy {name!r}: dlq_topic {self.dlq_topic!r} is not a topic name")
        if self.backoff is not None:
            if not isinstance(self.backoff, Backoff):
                raise PolicyError(
                    f"policy {name!r}: backoff must be Backoff(base=..., factor=..., max=...), not {self.backoff!r}"
                )
            if self.backoff.problem:
                raise PolicyError(f"policy {name!r}: {self.backoff.problem}")

    @property
    def max_age_ms(self) -> int | None:
        return self._max_age_ms

    def delay_ms(self, attempt: int, retry_id: str = "") -> int:
        """Delay before retry number ``attempt + 1`` (``attempt`` retries already made)."""
        if self.backoff is not None:
            return self.backoff.delay_ms(attempt, _spread(retry_id, attempt))
        return self._delays_ms[min(attempt, len(self._delays_ms) - 1)]

    def is_fatal(self, error_class: str | None) -> bool:
        if not error_class or not self._fatal:
            return False
        return error_class in self._fatal or error_class.rsplit(".", 1)[-1] in self._fatal

    def decide(
        self,
        *,
        attempt: int,
        first_seen_ms: int,
        base_ms: int,
        now_ms: int,
        retry_id: str = "",
        error_class: str | None = None,
        at_ms: int | None = None,
        send_to_dlq: bool = False,
    ) -> Decision:
        """Decide the fate of a record that failed after ``attempt`` retries.

        ``base_ms`` is when the delay starts counting (the record's timestamp); ``at_ms`` an
        explicit due time from ``retry.at``, which wins over the computed one.
        """
        # Fatal first: an SDK that classified the error fatal also asks for the DLQ.
        if self.is_fatal(error_class):
            return Decision(now_ms, protocol.DEAD_FATAL)
        if send_to_dlq:
            return Decision(now_ms, protocol.DEAD_REQUESTED)
        if attempt >= self.max_attempts:
            return Decision(now_ms, protocol.DEAD_EXHAUSTED)
        due = at_ms if at_ms is not None else base_ms + self.delay_ms(attempt, retry_id)
        max_age = self.max_age_ms
        if max_age is not None and max(now_ms, due) - first_seen_ms > max_age:
            return Decision(now_ms, protocol.DEAD_EXPIRED)
        return Decision(due)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _spread(retry_id: str, attempt: int) -> float:
    digest = hashlib.blake2b(f"{retry_id}/{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True)
class PolicyRegistry:
    """Named policies and the destinations a deployment declares.

    ``default`` always exists. ``declarations`` holds one
    :class:`~retry_scheduler.core.declarations.Destination` per destination or glob, each allowed and
    with its rules (:meth:`rules`); ``allowed`` the ``ALLOWED_DESTINATIONS`` entries as written (names,
    globs, compiled regexes, see :mod:`retry_scheduler.core.destinations`).
    """

    policies: Mapping[str, Policy]
    declarations: Declarations = field(default_factory=Declarations)
    allowed: tuple[Allowed, ...] = ()

    def __post_init__(self) -> None:
        if DEFAULT_POLICY not in self.policies:
            raise PolicyError("the policy 'default' must exist")
        for declaration in self.declarations:
            if declaration.policy is not None and declaration.policy not in self.policies:
                where = declaration.origin or f"destination {declaration.pattern!r}"
                raise PolicyError(f"{where} maps to undeclared policy {declaration.policy!r}")
        try:
            rules = Destinations.of(self.allow_rules)
        except (DestinationRuleError, re.error) as exc:
            raise PolicyError(str(exc)) from None
        for policy in sorted(self.policies.values(), key=lambda p: p.name):
            if rules.refusal(policy.dlq_topic) is None:
                raise PolicyError(
                    f"policy {policy.name!r}: its dlq_topic {policy.dlq_topic!r} is also an allowed destination "
                    "(DESTINATIONS or ALLOWED_DESTINATIONS): a retry could be published to the DLQ topic; "
                    "narrow the pattern or choose another dlq_topic"
                )

    @classmethod
    def of(
        cls,
        policies: Iterable[Policy],
        destinations: Mapping[str, str] | Iterable[Destination] | None = None,
        allowed: Iterable[Allowed] = (),
        rate_limits: Mapping[str, float] | None = None,
        breakers: Mapping[str, Breaker] | None = None,
        *,
        module: str = "",
    ) -> PolicyRegistry:
        """Build a registry; adds a conservative ``default`` when none is declared. ``destinations``:
        a list of :class:`~retry_scheduler.core.declarations.Destination`, or the older dict of topic
        -> policy name; ``rate_limits`` and ``breakers`` are the older ``RATE_LIMITS`` and ``BREAKERS``
        (:func:`~retry_scheduler.core.declarations.from_dicts`). ``module`` names where they were
        declared, in errors."""
        by_name = _checked_policies(policies)
        by_name.setdefault(DEFAULT_POLICY, DEFAULT)
        allowed = _checked_allowed(allowed)
        try:
            declarations = Declarations(
                from_dicts(destinations, rate_limits, breakers, allowed, module=module)
            )
        except (DeclarationError, BreakerError) as exc:
            raise PolicyError(str(exc)) from None
        return cls(by_name, declarations, allowed)

    @property
    def allow_rules(self) -> list[Allowed]:
        """What the policies allow as destinations: every declared name and glob, and the
        ``ALLOWED_DESTINATIONS`` regexes."""
        return [*self.declarations.allowed, *regexes(self.allowed)]

    def any(self, rule: str) -> bool:
        """Whether any destination's declaration sets ``rule`` (a field of a declaration)."""
        return self.declarations.any(rule)

    def rules(self, destination: str) -> DestinationRules:
        """Everything declared for ``destination``, resolved (:mod:`retry_scheduler.core.declarations`)."""
        return self.declarations.rules(destination)

    def rate_limit(self, destination: str) -> float | None:
        """The most records per second the service publishes to ``destination``; None: no limit."""
        return self.rules(destination).rate_limit

    def breaker(self, destination: str) -> Breaker | None:
        """The breaker of ``destination``; None: it has none."""
        return self.rules(destination).breaker

    def has_breaker(self, destination: str) -> bool:
        return self.rules(destination).breaker is not None

    def get(self, name: str) -> Policy:
        try:
            return self.policies[name]
        except KeyError:
            known = ", ".join(sorted(self.policies))
            raise UnknownPolicyError(f"unknown policy {name!r} (declared: {known})") from None

    def resolve(self, name: str | None, destination: str | None) -> Policy:
        """The record's named policy, else its destination's, else ``default``."""
        if name:
            return self.get(name)
        if destination:
            declared = self.rules(destination).policy
            if declared is not None:
                return self.policies[declared]
        return self.policies[DEFAULT_POLICY]

    @property
    def dlq_topics(self) -> set[str]:
        return {p.dlq_topic for p in self.policies.values()}


def _checked_policies(policies: object) -> dict[str, Policy]:
    """``POLICIES`` checked: a list of :class:`Policy`, each name once; by name."""
    if isinstance(policies, str | bytes | Mapping) or not isinstance(policies, Iterable):
        raise PolicyError(f"POLICIES must be a list of Policy(...), not {type(policies).__name__}")
    by_name: dict[str, Policy] = {}
    for n, policy in enumerate(policies):
        if not isinstance(policy, Policy):
            raise PolicyError(
                f"POLICIES[{n}] is a {type(policy).__name__}, not a Policy: write Policy('name', "
                "delays=[...], max_attempts=...)"
            )
        if policy.name in by_name:
            raise PolicyError(f"policy {policy.name!r} is declared twice")
        by_name[policy.name] = policy
    return by_name


def _checked_allowed(allowed: object) -> tuple[Allowed, ...]:
    if isinstance(allowed, str | re.Pattern) or not isinstance(allowed, Iterable):
        raise PolicyError("ALLOWED_DESTINATIONS must be a list, e.g. ['orders', 'shop.*']")
    return tuple(allowed)


#: Used when the policies module declares no ``default``.
DEFAULT = Policy(DEFAULT_POLICY, delays=["10s", "1m", "5m", "30m"], max_attempts=4, max_age="7d")


def load_policies_module(path: str | Path) -> ModuleType:
    """Import the policies module at *path* as it is (its policies, destinations and alert channels)."""
    path = Path(path)
    if not path.is_file():
        raise PolicyError(f"policies module {path} does not exist (set RETRY_POLICIES to its path)")
    spec = importlib.util.spec_from_file_location("retry_policies", path)
    if spec is None or spec.loader is None:
        raise PolicyError(f"cannot import policies module {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        # Where in the module, and what: one line, not a traceback through this package.
        line = next(
            (f.lineno for f in reversed(traceback.extract_tb(exc.__traceback__)) if f.filename == str(path)),
            getattr(exc, "lineno", None),
        )
        where = f"{path}, line {line}" if line else str(path)
        what = str(exc) if isinstance(exc, PolicyError | BreakerError) else f"{type(exc).__name__}: {exc}"
        raise PolicyError(f"{where}: {what}") from None
    return module


def load_policies(paths: str | Path | Sequence[str | Path]) -> PolicyRegistry:
    """Import the policies module at each of ``paths`` and return the deployment's registry.

    A module declares ``POLICIES`` (a list of :class:`Policy`) and optionally ``DESTINATIONS`` (a
    list of :class:`~retry_scheduler.core.declarations.Destination`), or the older spellings:
    ``DESTINATIONS`` as a dict of topic -> policy name, ``ALLOWED_DESTINATIONS`` (the other topics
    retries may go to: names, globs like ``"orders.*"`` or ``re.compile(...)``), ``RATE_LIMITS``
    (destination name or glob -> the most records per second published to it) and ``BREAKERS``
    (destination name or glob -> :class:`~retry_scheduler.core.breakers.Breaker`).

    Several modules (one per team, say) make one registry: each declares its own policies and
    destinations, and a policy or a destination declared by two of them is an error naming both. A
    destination may use a policy another module declares. Of several modules, one may leave
    ``POLICIES`` out.
    """
    files = [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]
    if not files:
        raise PolicyError("no policies module given")
    policies: dict[str, tuple[Policy, Path]] = {}
    destinations: dict[str, tuple[Destination, Path]] = {}
    allowed: list[Allowed] = []
    for path in files:
        module = load_policies_module(path)
        declared = getattr(module, "POLICIES", None if len(files) == 1 else [])
        if declared is None:
            raise PolicyError(f"{path} must define POLICIES = [Policy(...), ...]")
        for name, policy in _checked_policies(declared).items():
            if name in policies:
                raise PolicyError(
                    f"policy {name!r} is declared in both {policies[name][1]} and {path}: keep it in one module"
                )
            policies[name] = (policy, path)
        own_allowed = _checked_allowed(getattr(module, "ALLOWED_DESTINATIONS", ()))
        try:
            found = from_dicts(
                getattr(module, "DESTINATIONS", {}),
                getattr(module, "RATE_LIMITS", None),
                getattr(module, "BREAKERS", None),
                own_allowed,
                module=path.name,
            )
            own = Declarations(found)  # one declaration per pattern within the module
        except (DeclarationError, BreakerError) as exc:
            raise PolicyError(str(exc)) from None
        for declaration in own:
            if declaration.pattern in destinations:
                raise PolicyError(
                    f"destination {declaration.pattern!r} is declared in both "
                    f"{destinations[declaration.pattern][1]} and {path}: each destination belongs to one module"
                )
            destinations[declaration.pattern] = (declaration, path)
        allowed += own_allowed
    by_name = {name: policy for name, (policy, _) in policies.items()}
    by_name.setdefault(DEFAULT_POLICY, DEFAULT)
    return PolicyRegistry(by_name, Declarations(d for d, _ in destinations.values()), tuple(allowed))
