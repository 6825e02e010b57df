"""Fixtures shared by the integration tests: the ``loop`` of ``test_loop`` (settings, registry, topics)."""

from tests.integration.test_loop import loop  # noqa: F401
