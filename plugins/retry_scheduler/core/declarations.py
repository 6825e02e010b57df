"""One declaration per destination: everything that applies to it, in one place.

A policies module declares each destination it knows once, with all that applies to it::

    from retry_scheduler import Breaker, Destination

    DESTINATIONS = [
        Destination("payments", policy="payments", rate_limit=200, breaker=Breaker(failure_rate=0.5)),
        Destination("shop.*", rate_limit=1000),   # a glob: every topic it matches
        Destination("orders"),                    # allowed, with the default policy and no limits
    ]

Declaring a destination allows retries to go to it, unless it says ``allow=False``: a rule for
destinations allowed elsewhere, as in ``Destination("*", breaker=Breaker(), allow=False)`` (a breaker
for every destination, opening none). The older spellings (``DESTINATIONS`` as a dict
of topic -> policy name, ``RATE_LIMITS``, ``BREAKERS``, ``ALLOWED_DESTINATIONS``) still work: they
build the same declarations (:func:`from_dicts`); ``RATE_LIMITS`` and ``BREAKERS`` never allowed a
destination, and their declarations do not.

**Which declaration wins.** A destination's rules are resolved field by field: each field
(``policy``, ``rate_limit``, ``breaker``, ...) comes from the most specific declaration that matches the
destination and sets it. A topic's own name is the most specific; then the glob with the most
characters besides its ``*``; between globs as specific as each other, the one declared first.
``Destination("shop.*", rate_limit=1000)`` and ``Destination("shop.payments", breaker=Breaker())``
give ``shop.payments`` both its breaker and the rate limit of 1 000/s.

**A new per-destination setting** is one field here (checked in :meth:`Destination.__post_init__`,
resolved like the others with nothing more to write) and, when the publish round applies it, one gate
(:mod:`retry_scheduler.loops.gates`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from retry_scheduler.core.breakers import Breaker
from retry_scheduler.core.destinations import DestinationRuleError, glob_pattern

#: The highest rate limit one may declare (records per second per destination).
MAX_RATE_LIMIT = 1_000_000.0


class DeclarationError(ValueError):
    """A destination's declaration is wrong; the message names the declaration and the field."""


@dataclass(frozen=True)
class Destination:
    """What applies to the destination topics matching ``pattern`` (a topic name or a glob such as
    ``"shop.*"``); a field left None says nothing, and a less specific declaration may set it (see the
    module).

    ``policy``: the name of the retry policy of its records that name none (``retry.policy``);
    ``rate_limit``: the most records per second the service publishes to it (retries, replays and bulk
    retries alike); ``breaker``: holds its due jobs while its consumer keeps failing them; ``allow``:
    whether retries may go to the topics it matches (False: only its rules, for topics allowed by
    another declaration or by ``RETRY_DESTINATION_ALLOWLIST``).
    """

    pattern: str
    policy: str | None = None
    rate_limit: float | None = None
    breaker: Breaker | None = None
    allow: bool = True
    #: Where it was declared (a module and the spelling used), for errors; not compared.
    origin: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = self.origin or f"Destination({self.pattern!r})"
        if not isinstance(self.pattern, str) or not self.pattern:
            raise DeclarationError(f"{where}: give a destination topic or a glob like 'shop.*'")
        try:
            glob_pattern(self.pattern)
        except DestinationRuleError as exc:
            raise DeclarationError(f"{where}: {exc}") from None
        if self.policy is not None and (not isinstance(self.policy, str) or not self.policy):
            raise DeclarationError(f"{where}: policy={self.policy!r}: give a policy's name")
        rate = self.rate_limit
        if rate is not None and (
            isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= MAX_RATE_LIMIT
        ):
            raise DeclarationError(
                f"{where}: rate_limit={rate!r}: give records per second, more than 0 and at most "
                f"{MAX_RATE_LIMIT:,.0f} (or leave it out for no limit)"
            )
        if not isinstance(self.allow, bool):
            raise DeclarationError(f"{where}: allow={self.allow!r}: give True or False")
        if self.breaker is not None and not isinstance(self.breaker, Breaker):
            raise DeclarationError(
                f"{where}: breaker is a {type(self.breaker).__name__}: write Breaker(failure_rate=0.5, ...) "
                "(from retry_scheduler import Breaker)"
            )

    @property
    def is_glob(self) -> bool:
        return "*" in self.pattern

    def merged(self, other: Destination) -> Destination:
        """This declaration with the fields ``other`` sets; :class:`DeclarationError` when both set one
        differently (the same destination declared twice)."""
        if type(other) is not type(self):
            raise DeclarationError(
                f"destination {self.pattern!r} is declared twice, as a {type(self).__name__} "
                f"({self.origin or 'one'}) and as a {type(other).__name__} ({other.origin or 'another'})"
            )
        changes: dict[str, Any] = {"allow": self.allow or other.allow}
        for f in _rule_fields(self):
            mine, theirs = getattr(self, f), getattr(other, f)
            if theirs is None:
                continue
            if mine is not None and mine != theirs:
                raise DeclarationError(
                    f"destination {self.pattern!r} is declared twice with different {f}: "
                    f"{self.origin or 'one'} says {mine!r}, {other.origin or 'another'} says {theirs!r}"
                )
            changes[f] = theirs
        return replace(self, **changes)


def _rule_fields(declaration: Destination) -> tuple[str, ...]:
    """The fields of a declaration resolved per destination: all but its pattern, origin and allow (a
    subclass's own fields too)."""
    return tuple(f.name for f in fields(declaration) if f.name not in ("pattern", "origin", "allow"))


#: The fields of :class:`Destination` that apply to a destination.
RULE_FIELDS = _rule_fields(Destination("x"))


@dataclass(frozen=True)
class DestinationRules:
    """A destination's rules resolved from every declaration that matches it (see the module): the
    fields of :class:`Destination`, each from the declaration that set it (``sources``)."""

    destination: str
    policy: str | None = None
    rate_limit: float | None = None
    breaker: Breaker | None = None
    #: Whether any declaration matches it (a declared destination is allowed).
    declared: bool = False
    #: field -> the pattern of the declaration it came from.
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    #: The fields of a subclass of :class:`Destination` (a setting of one's own), resolved the same way.
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def value(self, rule: str) -> Any:
        """The resolved value of the field ``rule`` (one of :class:`Destination`'s or a subclass's);
        None when no declaration sets it."""
        return getattr(self, rule) if rule in RULE_FIELDS else self.extra.get(rule)


def _specificity(declaration: Destination) -> tuple[int, int]:
    """Sorts the most specific first: a name, then the glob with the most characters besides ``*``."""
    if not declaration.is_glob:
        return (0, 0)
    return (1, -(len(declaration.pattern) - declaration.pattern.count("*")))


#: How many destinations' resolved rules are kept (a hostile producer may name any topic).
_REMEMBERED = 4096


class Declarations:
    """Every destination a deployment declares, one :class:`Destination` per pattern, and the rules
    each destination resolves to (:meth:`rules`, see the module)."""

    def __init__(self, declarations: Iterable[Destination] = ()) -> None:
        by_pattern: dict[str, Destination] = {}
        for declaration in declarations:
            if not isinstance(declaration, Destination):
                raise DeclarationError(
                    f"{type(declaration).__name__} {declaration!r} is not a Destination: write "
                    "Destination('topic', policy=..., rate_limit=..., breaker=...)"
                )
            known = by_pattern.get(declaration.pattern)
            by_pattern[declaration.pattern] = declaration if known is None else known.merged(declaration)
        #: Most specific first (a stable sort keeps the declared order between equals).
        self.declarations: tuple[Destination, ...] = tuple(sorted(by_pattern.values(), key=_specificity))
        self._names = {d.pattern: d for d in self.declarations if not d.is_glob}
        self._globs = [(d, glob_pattern(d.pattern)) for d in self.declarations if d.is_glob]
        self._resolved: dict[str, DestinationRules] = {}
        self._sets: dict[str, bool] = {}

    def __iter__(self) -> Any:
        return iter(self.declarations)

    def __len__(self) -> int:
        return len(self.declarations)

    @property
    def allowed(self) -> list[str]:
        """The names and globs whose declarations allow retries to go to the topics they match."""
        return [d.pattern for d in self.declarations if d.allow]

    def any(self, rule: str) -> bool:
        """Whether any declaration sets ``rule`` (a field name): a gate with nothing to do costs nothing."""
        if rule not in self._sets:
            self._sets[rule] = any(getattr(d, rule, None) is not None for d in self.declarations)
        return self._sets[rule]

    def matching(self, destination: str) -> list[Destination]:
        """The declarations that match ``destination``, most specific first."""
        found = [self._names[destination]] if destination in self._names else []
        return found + [d for d, compiled in self._globs if compiled and compiled.fullmatch(destination)]

    def rules(self, destination: str) -> DestinationRules:
        """``destination``'s rules (see the module); looked up once per destination."""
        known = self._resolved.get(destination)
        if known is not None:
            return known
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        matching = self.matching(destination)
        for declaration in matching:
            for f in _rule_fields(declaration):
                value = getattr(declaration, f)
                if f not in values and value is not None:
                    values[f], sources[f] = value, declaration.pattern
        extra = {f: values.pop(f) for f in list(values) if f not in RULE_FIELDS}
        rules = DestinationRules(destination, declared=bool(matching), sources=sources, extra=extra, **values)
        if len(self._resolved) >= _REMEMBERED:
            self._resolved.clear()
        self._resolved[destination] = rules
        return rules


def _mapping(declared: object, name: str, example: str, at: str) -> Mapping[Any, Any]:
    if declared is None:
        return {}
    if not isinstance(declared, Mapping):
        raise DeclarationError(
            f"{at}{name} must be a dict of destination (or glob) -> {example}, not {type(declared).__name__}"
        )
    return declared


def from_dicts(
    destinations: object = None,
    rate_limits: object = None,
    breakers: object = None,
    allowed: Iterable[object] = (),
    *,
    module: str = "",
) -> list[Destination]:
    """The declarations that the older spellings of a policies module make: ``DESTINATIONS`` (a list
    of :class:`Destination`, or a dict of topic -> policy name), ``RATE_LIMITS`` (name or glob ->
    records per second), ``BREAKERS`` (name or glob -> :class:`Breaker`) and the names and globs of
    ``ALLOWED_DESTINATIONS`` (its compiled regexes stay allow rules only). ``module`` names where they
    were declared, in errors."""
    at = f"{module}: " if module else ""
    found: list[Destination] = []
    if isinstance(destinations, Mapping):
        for pattern, policy in destinations.items():
            if not isinstance(pattern, str) or not isinstance(policy, str):
                raise DeclarationError(
                    f"{at}DESTINATIONS maps {pattern!r} to {policy!r}: both must be strings (topic, policy name)"
                )
            found.append(Destination(pattern, policy=policy, origin=f"{at}DESTINATIONS[{pattern!r}]"))
    elif destinations is not None:
        if isinstance(destinations, str | bytes) or not isinstance(destinations, Iterable):
            raise DeclarationError(
                f"{at}DESTINATIONS must be a list of Destination(...) (or a dict of topic -> policy name), "
                f"not {type(destinations).__name__}"
            )
        for n, declaration in enumerate(destinations):
            if not isinstance(declaration, Destination):
                raise DeclarationError(
                    f"{at}DESTINATIONS[{n}] is a {type(declaration).__name__}, not a Destination: write "
                    "Destination('topic', policy=..., rate_limit=..., breaker=...)"
                )
            found.append(replace(declaration, origin=declaration.origin or f"{at}{declaration.pattern!r}"))
    for pattern, rate in _mapping(
        rate_limits, "RATE_LIMITS", "records per second, e.g. {'payments': 200}", at
    ).items():
        found.append(_sugar(pattern, "RATE_LIMITS", at, rate_limit=rate, allow=False))
    for pattern, breaker in _mapping(
        breakers, "BREAKERS", "Breaker(...), e.g. {'payments': Breaker()}", at
    ).items():
        found.append(_sugar(pattern, "BREAKERS", at, breaker=breaker, allow=False))
    for entry in allowed:
        if isinstance(entry, str):
            found.append(_sugar(entry, "ALLOWED_DESTINATIONS", at))
        elif not isinstance(entry, re.Pattern):
            raise DeclarationError(
                f"{at}ALLOWED_DESTINATIONS entry {entry!r} must be a topic name, a glob like 'orders.*' or "
                "re.compile(...)"
            )
    return found


def _sugar(pattern: object, name: str, at: str, **rule: Any) -> Destination:
    if not isinstance(pattern, str) or not pattern:
        raise DeclarationError(
            f"{at}{name} key {pattern!r} must be a destination topic or a glob like 'shop.*'"
        )
    return Destination(pattern, origin=f"{at}{name}[{pattern!r}]", **rule)


def regexes(allowed: Iterable[object]) -> tuple[re.Pattern[str], ...]:
    """The compiled regexes of ``ALLOWED_DESTINATIONS`` (allow rules with no declaration of their own)."""
    return tuple(entry for entry in allowed if isinstance(entry, re.Pattern))
