"""Teams own their part: a deployment loads several policies modules (a folder of
``retry_policies*.py``, or a comma-separated list), each declaring its own policies and destinations;
two declaring the same one is an error naming both. The alert channels of each are used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retry_scheduler.airflow.notifiers import declared_channels
from retry_scheduler.cli.main import main
from retry_scheduler.core.config import ConfigError, Settings
from retry_scheduler.core.deployment import Deployment
from retry_scheduler.core.policy import PolicyError

HEAD = "from retry_scheduler import Breaker, Destination, Policy\n"
PAYMENTS = HEAD + (
    'POLICIES = [Policy("payments", delays=["1s"], max_attempts=8, dlq_topic="payments.dlq")]\n'
    'DESTINATIONS = [Destination("payments", policy="payments", rate_limit=200)]\n'
)
SHOP = HEAD + (
    'DESTINATIONS = [Destination("shop.*", breaker=Breaker()), Destination("shop.refunds", policy="payments")]\n'
)


def team_folder(tmp_path: Path, **modules: str) -> Path:
    folder = tmp_path / "policies"
    folder.mkdir()
    for name, text in modules.items():
        (folder / f"{name}.py").write_text(text)
    return folder


def test_a_folder_of_team_modules_is_one_deployment(tmp_path: Path) -> None:
    folder = team_folder(
        tmp_path, retry_policies_payments=PAYMENTS, retry_policies_shop=SHOP, notes="POLICIES = 1\n"
    )
    settings = Settings(policies_path=str(folder))
    assert [p.name for p in settings.policies_files] == [
        "retry_policies_payments.py",
        "retry_policies_shop.py",
    ]
    deployment = Deployment.load(settings)
    registry = deployment.policies
    assert registry.resolve(None, "payments").max_attempts == 8
    # The shop team's destination uses the payments team's policy.
    assert registry.resolve(None, "shop.refunds").name == "payments"
    assert registry.has_breaker("shop.refunds") and registry.rate_limit("payments") == 200
    allows = deployment.destinations.allows
    assert allows("payments") and allows("shop.cart") and not allows("orders")
    # The same as a list, in any order of modules.
    listed = Settings(
        policies_path=f"{folder / 'retry_policies_shop.py'}, {folder / 'retry_policies_payments.py'}"
    )
    assert Deployment.load(listed).policies.rules("shop.refunds") == registry.rules("shop.refunds")


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (HEAD + 'DESTINATIONS = [Destination("payments", rate_limit=50)]\n',
         r"destination 'payments' is declared in both .*retry_policies_a\.py and .*retry_policies_b\.py"),
        (HEAD + 'RATE_LIMITS = {"payments": 50}\n', r"destination 'payments' is declared in both"),
        (HEAD + 'POLICIES = [Policy("payments", delays=["2s"])]\n',
         r"policy 'payments' is declared in both .*retry_policies_a\.py and .*retry_policies_b\.py"),
        (HEAD + 'DESTINATIONS = [Destination("orders", policy="ghost")]\n',
         r"retry_policies_b\.py: 'orders' maps to undeclared policy 'ghost'"),
    ],
)  # fmt: skip
def test_two_modules_declaring_the_same_thing_is_an_error_naming_both(
    tmp_path: Path, second: str, message: str
) -> None:
    folder = team_folder(tmp_path, retry_policies_a=PAYMENTS, retry_policies_b=second)
    with pytest.raises(PolicyError, match=message):
        Deployment.load(Settings(policies_path=str(folder)))


def test_an_empty_folder_says_what_it_looked_for(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="holds no retry_policies"):
        _ = Settings(policies_path=str(tmp_path)).policies_files


def test_policies_check_shows_the_teams_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = team_folder(tmp_path, retry_policies_payments=PAYMENTS, retry_policies_shop=SHOP)
    assert main(["policies", "check", str(folder), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert len(shown["files"]) == 2
    assert {d["destination"] for d in shown["destinations"]} == {"payments", "shop.*", "shop.refunds"}
    second = folder / "retry_policies_payments.py"
    (tmp_path / "retry_policies_other.py").write_text(HEAD + 'DESTINATIONS = [Destination("payments")]\n')
    assert main(["policies", "check", str(second), str(tmp_path / "retry_policies_other.py")]) == 2
    assert "'payments' is declared in both" in capsys.readouterr().err


def test_each_modules_alert_channels_are_used(tmp_path: Path) -> None:
    channel = "from retry_scheduler.airflow.notifiers import LogNotifier\nALERT_CHANNELS = [LogNotifier()]\n"
    folder = team_folder(
        tmp_path, retry_policies_payments=PAYMENTS + channel, retry_policies_shop=SHOP + channel
    )
    channels = declared_channels({"RETRY_POLICIES": str(folder)})
    assert [c.kind for c in channels] == ["log", "log"]
