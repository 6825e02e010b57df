"""Which topics the service may publish retries to: none, unless a deployment allows them.

Allowed are the names and patterns the policies module declares (``ALLOWED_DESTINATIONS``, plus
the destinations ``DESTINATIONS`` maps to a policy) and whatever ``RETRY_DESTINATION_ALLOWLIST``
(a regular expression) adds. Never allowed, whatever is declared: internal topics (a name starting
with ``_``, as ``__consumer_offsets`` or ``_schemas``), the retry topics and the DLQ topics. A
group's redelivery topic (``{topic}.{group}.redelivery``) is allowed when its topic is.
The rules are checked at ingest (a record for a refused destination is dead ``invalid``) and again
before every publish, DLQ replay and bulk replay, so a destination taken off the list after its
jobs were stored is not published to.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from retry_scheduler.core.protocol import TOPIC_NAME, redelivery_bases

#: What a deployment may list in ``ALLOWED_DESTINATIONS``: a topic name, a glob on topic names
#: (``*`` is not a topic-name character, so ``orders.*`` can only be a glob) or a compiled regex.
Allowed = str | re.Pattern[str]


class DestinationRuleError(ValueError):
    """An entry of ``ALLOWED_DESTINATIONS`` is neither a topic name, a glob nor a regex."""


@functools.lru_cache(maxsize=1024)
def glob_pattern(entry: str) -> re.Pattern[str] | None:
    """A topic name or a glob (``*`` matches any run of topic-name characters) as a pattern; None for
    a name. :class:`DestinationRuleError` when it is neither."""
    if "*" in entry:
        parts = entry.split("*")
        if not all(part == "" or TOPIC_NAME.fullmatch(part) for part in parts):
            raise DestinationRuleError(f"glob {entry!r} holds characters no topic name has")
        return re.compile("[a-zA-Z0-9._-]*".join(re.escape(part) for part in parts))
    if not TOPIC_NAME.fullmatch(entry):
        raise DestinationRuleError(f"{entry!r} is neither a valid topic name nor a glob like 'orders.*'")
    return None


def _pattern(entry: Allowed) -> re.Pattern[str] | None:
    """The entry as a pattern; None for an exact name."""
    if isinstance(entry, re.Pattern):
        return entry
    if not isinstance(entry, str):
        raise DestinationRuleError(
            f"ALLOWED_DESTINATIONS entry {entry!r} must be a topic name, a glob like 'orders.*' or re.compile(...)"
        )
    try:
        return glob_pattern(entry)
    except DestinationRuleError as exc:
        raise DestinationRuleError(f"ALLOWED_DESTINATIONS entry: {exc}") from None


#: How many topics' answers :meth:`Destinations.refusal` keeps (a hostile producer may send any name).
_REMEMBERED = 4096


@dataclass(frozen=True)
class Destinations:
    """The destination rules of one deployment; :meth:`refusal` says whether a topic may be one."""

    names: frozenset[str] = frozenset()
    patterns: tuple[re.Pattern[str], ...] = ()
    #: This service's own topics: the retry, adopted, DLQ and holds topics.
    own_topics: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls, allowed: Iterable[Allowed], allowlist: str = "", own_topics: Iterable[str] = ()
    ) -> Destinations:
        """Rules from declared entries, an added regular expression (may be empty) and the own topics."""
        names: set[str] = set()
        patterns: list[re.Pattern[str]] = []
        for entry in allowed:
            pattern = _pattern(entry)
            if pattern is None:
                names.add(str(entry))
            else:
                patterns.append(pattern)
        if allowlist:
            patterns.append(re.compile(allowlist))
        return cls(frozenset(names), tuple(patterns), frozenset(own_topics))

    def refusal(self, topic: str) -> str | None:
        """Why ``topic`` may not be a destination, in words for the job's record; None when it may.

        Remembered per topic (the ingest asks for every record, of a few destinations), up to
        :data:`_REMEMBERED` topics at a time."""
        memo: dict[str, str | None] = self.__dict__.setdefault("_memo", {})
        try:
            return memo[topic]
        except KeyError:
            pass
        if len(memo) >= _REMEMBERED:
            memo.clear()
        memo[topic] = refusal = self._refusal(topic)
        return refusal

    def _refusal(self, topic: str) -> str | None:
        if not TOPIC_NAME.fullmatch(topic):
            return (
                f"destination {topic!r} is not allowed: not a topic name ([A-Za-z0-9._-], 1-249 characters)"
            )
        if topic.startswith("_"):
            return f"destination {topic!r} is not allowed: internal topics never are"
        if topic in self.own_topics:
            return (
                f"destination {topic!r} is not allowed: it is a topic this service keeps for itself "
                "(a retry, adopted, DLQ or holds topic)"
            )
        if self._declared(topic):
            return None
        # A group's redelivery topic ({topic}.{group}.redelivery) of a destination that is allowed
        if any(
            base not in self.own_topics and not base.startswith("_") and self._declared(base)
            for base in redelivery_bases(topic)
        ):
            return None
        return (
            f"destination {topic!r} is not allowed: add it to ALLOWED_DESTINATIONS in the policies "
            "module (or to RETRY_DESTINATION_ALLOWLIST)"
        )

    def _declared(self, topic: str) -> bool:
        return topic in self.names or any(p.fullmatch(topic) for p in self.patterns)

    def allows(self, topic: str) -> bool:
        return self.refusal(topic) is None
