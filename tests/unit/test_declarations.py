"""One declaration per destination (``Destination``): which declaration wins, field by field; the older
dicts build the same declarations; declaring allows, the rules-only spellings do not."""

from __future__ import annotations

import dataclasses

import pytest

from retry_scheduler import Breaker, Destination, Policy
from retry_scheduler.core.config import Settings
from retry_scheduler.core.declarations import DeclarationError, Declarations
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.policy import PolicyError, PolicyRegistry

PAY = Policy("pay", delays=["1s"])


def test_each_field_comes_from_the_most_specific_declaration_that_sets_it() -> None:
    slow, fast = Breaker(min_records=50), Breaker(min_records=5)
    declared = Declarations(
        [
            Destination("*", rate_limit=1000, allow=False),
            Destination("shop.*", policy="pay", breaker=slow),
            Destination("shop.pay*", breaker=fast),
            Destination("shop.payments", rate_limit=20),
        ]
    )
    payments = declared.rules("shop.payments")
    assert (payments.policy, payments.rate_limit, payments.breaker) == ("pay", 20, fast)
    assert payments.sources == {"rate_limit": "shop.payments", "breaker": "shop.pay*", "policy": "shop.*"}
    cart = declared.rules("shop.cart")
    assert (cart.policy, cart.rate_limit, cart.breaker) == ("pay", 1000, slow)
    orders = declared.rules("orders")
    assert (orders.policy, orders.rate_limit, orders.breaker, orders.declared) == (None, 1000, None, True)


def test_between_globs_as_specific_as_each_other_the_first_declared_wins() -> None:
    declared = Declarations([Destination("a.*", rate_limit=1), Destination("*.b", rate_limit=2)])
    assert declared.rules("a.b").rate_limit == 1
    declared = Declarations([Destination("*.b", rate_limit=2), Destination("a.*", rate_limit=1)])
    assert declared.rules("a.b").rate_limit == 2


def test_the_older_dicts_build_the_same_declarations_as_the_list() -> None:
    breaker = Breaker(min_records=3)
    old = PolicyRegistry.of(
        [PAY],
        {"payments": "pay"},
        ["orders", "shop.*"],
        rate_limits={"payments": 200, "shop.*": 50},
        breakers={"payments": breaker},
    )
    new = PolicyRegistry.of(
        [PAY],
        [
            Destination("payments", policy="pay", rate_limit=200, breaker=breaker),
            Destination("orders"),
            Destination("shop.*", rate_limit=50),
        ],
    )
    for topic in ("payments", "orders", "shop.cart", "elsewhere"):
        assert old.rules(topic) == new.rules(topic), topic
        assert old.resolve(None, topic) == new.resolve(None, topic)
    assert sorted(old.declarations.allowed) == sorted(new.declarations.allowed)


def test_declaring_allows_but_rate_limits_breakers_and_allow_false_do_not() -> None:
    """``BREAKERS = {"*": Breaker()}`` is the documented way to put a breaker on every destination: it
    must not open the service to every topic."""
    registry = PolicyRegistry.of(
        [], [Destination("orders"), Destination("*", breaker=Breaker(), allow=False)], rate_limits={"x.*": 5}
    )
    rules = Deployment(Settings(), registry).destinations
    assert rules.allows("orders")
    assert not rules.allows("payments") and not rules.allows("x.y")
    assert registry.has_breaker("payments") and registry.rate_limit("x.y") == 5
    old = Deployment(Settings(), PolicyRegistry.of([], breakers={"*": Breaker()})).destinations
    assert not old.allows("orders")
    # A topic both a DESTINATIONS entry and a RATE_LIMITS key is allowed (as in 0.4).
    both = PolicyRegistry.of([], {"orders": "default"}, rate_limits={"orders": 5})
    assert Deployment(Settings(), both).destinations.allows("orders") and both.rate_limit("orders") == 5


def test_a_destination_declared_twice_differently_is_an_error_naming_both() -> None:
    with pytest.raises(
        PolicyError, match=r"'orders' is declared twice with different rate_limit: .*RATE_LIMITS"
    ):
        PolicyRegistry.of([], [Destination("orders", rate_limit=5)], rate_limits={"orders": 9})
    # Saying the same thing twice is no conflict.
    same = PolicyRegistry.of([], [Destination("orders", rate_limit=5)], rate_limits={"orders": 5})
    assert same.rate_limit("orders") == 5


@pytest.mark.parametrize(
    ("declaration", "message"),
    [
        (lambda: Destination(""), "give a destination topic or a glob"),
        (lambda: Destination("no spaces"), "neither a valid topic name nor a glob"),
        (lambda: Destination("shop.*!"), "holds characters no topic name has"),
        (lambda: Destination("x", policy=3), "policy=3: give a policy's name"),  # type: ignore[arg-type]
        (lambda: Destination("x", rate_limit=0), "rate_limit=0: give records per second"),
        (lambda: Destination("x", rate_limit=True), "rate_limit=True"),
        (lambda: Destination("x", rate_limit=float("nan")), "rate_limit=nan"),
        (lambda: Destination("x", breaker={"failure_rate": 0.5}), r"breaker is a dict: write Breaker\("),  # type: ignore[arg-type]
        (lambda: Destination("x", allow="yes"), "allow='yes': give True or False"),  # type: ignore[arg-type]
    ],
)
def test_a_wrong_declaration_is_one_clear_error(declaration: object, message: str) -> None:
    with pytest.raises(DeclarationError, match=message):
        declaration()  # type: ignore[operator]


def test_a_policy_named_by_a_declaration_must_exist() -> None:
    with pytest.raises(PolicyError, match="maps to undeclared policy 'ghost'"):
        PolicyRegistry.of([], [Destination("orders", policy="ghost")])
    with pytest.raises(PolicyError, match=r"DESTINATIONS\[0\] is a tuple, not a Destination"):
        PolicyRegistry.of([], [("orders", "pay")])  # type: ignore[list-item]


def test_any_number_of_hostile_names_keeps_the_resolved_rules_bounded() -> None:
    declared = Declarations([Destination("shop.*", rate_limit=5)])
    for n in range(10_000):
        assert declared.rules(f"shop.{n}").rate_limit == 5
    assert len(declared._resolved) <= 4096


def test_a_setting_of_ones_own_is_a_field_resolved_like_the_others() -> None:
    """What a new per-destination setting costs: a field (here on a subclass, as a test can add one)."""

    @dataclasses.dataclass(frozen=True)
    class Quiet(Destination):
        quiet_hours: str | None = None

    declared = Declarations([Quiet("shop.*", quiet_hours="22-06", rate_limit=5), Quiet("shop.cart")])
    cart = declared.rules("shop.cart")
    assert (cart.value("quiet_hours"), cart.value("rate_limit"), cart.sources["quiet_hours"]) == (
        "22-06",
        5,
        "shop.*",
    )
    assert declared.any("quiet_hours") and not declared.any("breaker")
    assert declared.rules("orders").value("quiet_hours") is None
