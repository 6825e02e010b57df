from __future__ import annotations

import pytest

from retry_scheduler.core.durations import format_duration_ms, parse_duration_ms
from retry_scheduler.core.policy import (
    Backoff,
    Policy,
    PolicyError,
    PolicyRegistry,
    UnknownPolicyError,
    load_policies,
)

NOW = 1_800_000_000_000  # frozen clock, epoch ms
S, M, H = 1000, 60_000, 3_600_000


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500),
        ("30s", 30 * S),
        ("5m", 5 * M),
        ("1h30m", 90 * M),
        ("1d", 24 * H),
        ("0s", 0),
        (2, 2 * S),
    ],
)
def test_parse_duration(text: str | int, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("bad", ["", "5", "m", "5 minutes", "-1s", "1s2", -3, True])
def test_parse_duration_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration_ms(bad)  # type: ignore[arg-type]


def test_format_duration_round_trips() -> None:
    for ms in (0, 250, S, 90 * S, 5 * M, 2 * H, 24 * H):
        assert parse_duration_ms(format_duration_ms(ms)) == ms


SCHEDULE = Policy("s", delays=["1m", "5m", "30m"], max_attempts=3, max_age="1d")


@pytest.mark.parametrize(("attempt", "delay"), [(0, M), (1, 5 * M), (2, 30 * M), (7, 30 * M)])
def test_schedule_delay_per_attempt(attempt: int, delay: int) -> None:
    assert SCHEDULE.delay_ms(attempt) == delay


@pytest.mark.parametrize(
    ("attempt", "expected"), [(0, 1 * S), (1, 2 * S), (2, 4 * S), (5, 32 * S), (6, 60 * S), (500, 60 * S)]
)
def test_backoff_without_jitter_is_capped(attempt: int, expected: int) -> None:
    policy = Policy("b", backoff=Backoff(base="1s", factor=2, max="1m"))
    assert policy.delay_ms(attempt) == expected


def test_backoff_jitter_stays_in_band_and_is_stable_per_retry_id() -> None:
    policy = Policy("b", backoff=Backoff(base="10s", factor=1, max="1h", jitter=0.2))
    delays = [policy.delay_ms(0, f"id-{i}") for i in range(500)]
    assert all(8 * S <= d <= 12 * S for d in delays)
    assert len(set(delays)) > 100  # really spread
    assert policy.delay_ms(0, "id-7") == policy.delay_ms(0, "id-7")


def decide(policy: Policy, **kw: object) -> tuple[int, str | None]:
    args: dict = {"attempt": 0, "first_seen_ms": NOW, "base_ms": NOW, "now_ms": NOW} | kw
    d = policy.decide(**args)
    return d.due_ms, d.dead_reason


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, (NOW + M, None)),
        ({"attempt": 2}, (NOW + 30 * M, None)),
        ({"attempt": 3}, (NOW, "exhausted")),
        ({"base_ms": NOW - 10 * S}, (NOW - 10 * S + M, None)),  # counted from the record timestamp
        ({"at_ms": NOW + 5 * H}, (NOW + 5 * H, None)),  # explicit retry.at wins
        ({"at_ms": NOW + 25 * H}, (NOW, "expired")),  # would be retried after max age
        ({"first_seen_ms": NOW - 25 * H}, (NOW, "expired")),
        ({"send_to_dlq": True}, (NOW, "requested")),
        ({"send_to_dlq": True, "error_class": "SchemaError"}, (NOW, "fatal")),
        ({"error_class": "app.errors.SchemaError"}, (NOW, "fatal")),
        ({"error_class": "SchemaError"}, (NOW, "fatal")),
        ({"error_class": "app.errors.Timeout"}, (NOW + M, None)),
    ],
)
def test_decide(kwargs: dict, expected: tuple[int, str | None]) -> None:
    policy = Policy(
        "p", delays=["1m", "5m", "30m"], max_attempts=3, max_age="1d", fatal_errors=["SchemaError"]
    )
    assert decide(policy, **kwargs) == expected


def test_zero_max_attempts_means_dead_at_once() -> None:
    assert decide(Policy("z", delays=["1s"], max_attempts=0)) == (NOW, "exhausted")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of"),
        ({"delays": ["1m"], "backoff": Backoff()}, "exactly one of"),
        ({"delays": []}, "must not be empty"),
        ({"delays": ["soon"]}, "not like"),
        ({"delays": ["1m"], "max_attempts": -1}, "max_attempts"),
        ({"delays": ["1m"], "dlq_topic": ""}, "dlq_topic"),
    ],
)
def test_policy_declaration_errors_name_the_fault(kwargs: dict, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        Policy("bad", **kwargs)


def test_registry_resolution_order() -> None:
    reg = PolicyRegistry.of([Policy("payments", delays=["1s"])], {"payments-topic": "payments"})
    assert reg.resolve(None, "payments-topic").name == "payments"
    assert reg.resolve(None, "other").name == "default"  # added when not declared
    assert reg.resolve("default", "payments-topic").name == "default"  # the header wins
    with pytest.raises(UnknownPolicyError, match="unknown policy 'nope'"):
        reg.resolve("nope", "payments-topic")


def test_registry_rejects_mapping_to_undeclared_policy() -> None:
    with pytest.raises(PolicyError, match="undeclared policy 'ghost'"):
        PolicyRegistry.of([], {"t": "ghost"})


def test_the_repository_policies_module_loads() -> None:
    from retry_scheduler.core.config import Settings

    reg = load_policies(Settings().policies_files)
    assert "default" in reg.policies
    assert reg.resolve(None, "demo.orders").name == "demo"


def test_missing_policies_module_says_where(tmp_path) -> None:
    with pytest.raises(PolicyError, match="RETRY_POLICIES"):
        load_policies(tmp_path / "nope.py")
