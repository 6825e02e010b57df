"""A deployment: its settings and the policies module they name, read once where a request comes in.

The front doors build one (:meth:`Deployment.load`): the Airflow hook for the DAGs' tasks, the Dead
letters page, the command line, a Spark job from its connection file. Everything below them (the
loops, the row builder, the dead-letter operations) takes it as a required argument and reads
neither the environment nor the policies module itself, so one request sees one configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from retry_scheduler.core.config import Settings
from retry_scheduler.core.destinations import Destinations
from retry_scheduler.core.headers import Limits
from retry_scheduler.core.policy import PolicyRegistry, load_policies


@dataclass(frozen=True)
class Deployment:
    """The settings and the policies of one deployment, and what follows from the two."""

    settings: Settings
    policies: PolicyRegistry = field(repr=False)

    @classmethod
    def load(cls, settings: Settings) -> Deployment:
        """``settings`` and the policies modules they name (``RETRY_POLICIES``, or ``retry_policies.py``
        beside the DAGs); a module that cannot be read raises :class:`~retry_scheduler.core.policy.PolicyError`."""
        return cls(settings, load_policies(settings.policies_files))

    def with_settings(self, **overrides: Any) -> Deployment:
        """The same policies with some settings changed (``Settings.with_overrides``)."""
        return replace(self, settings=self.settings.with_overrides(**overrides))

    @cached_property
    def destinations(self) -> Destinations:
        """The destination rules: what the policies module allows, plus
        ``RETRY_DESTINATION_ALLOWLIST``; never the service's own topics (the retry, adopted, holds and
        DLQ topics: publishing there would loop, hide the record or corrupt the helper's state) nor
        internal ones."""
        return Destinations.of(
            self.policies.allow_rules,
            self.settings.destination_allowlist,
            [*self.settings.own_topics, *self.policies.dlq_topics],
        )

    @cached_property
    def limits(self) -> Limits:
        """What a record's headers may hold, and where it may go."""
        return Limits(
            destinations=self.destinations,
            max_headers=self.settings.max_headers,
            max_header_value_bytes=self.settings.max_header_value_bytes,
            max_reason_chars=self.settings.max_reason_chars,
            max_header_name_chars=self.settings.max_header_name_chars,
        )

    @cached_property
    def max_ages(self) -> dict[str, int | None]:
        """Each policy's ``max_age`` in milliseconds (None: no limit), by policy name."""
        return {name: policy.max_age_ms for name, policy in self.policies.policies.items()}
