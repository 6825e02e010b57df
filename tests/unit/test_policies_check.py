"""``retry-scheduler policies check``: every policy mistake is one line naming the policy, the field and
where, exit 2; never a traceback. The loops load policies with the same checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retry_scheduler.cli.main import main

HEAD = "from retry_scheduler import Backoff, Breaker, Destination, Policy\n"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('POLICIES = [Policy("p", delays=["1s"], max_attempts="3")]',
         "line 2: policy 'p': max_attempts must be a whole number, not '3'"),
        ('POLICIES = [{"name": "p", "delays": ["1s"]}]',
         "POLICIES[0] is a dict, not a Policy: write Policy('name', delays=[...], max_attempts=...)"),
        ('POLICIES = [Policy("p", delays=["1s"], fatal_errors="ValueError")]',
         "line 2: policy 'p': fatal_errors must be a list of exception class names, e.g. ['ValueError'], "
         "not 'ValueError'"),
        ('POLICIES = [Policy("p", delays="10s")]', "line 2: policy 'p': delays must be a list"),
        ('POLICIES = [Policy("p", backoff=Backoff(base="1s", factor=0.5))]',
         "line 2: policy 'p': backoff factor must be a number >= 1, not 0.5"),
        ('POLICIES = [Policy("p", backoff=Backoff(base="soon"))]', "line 2: policy 'p': backoff "),
        ('POLICIES = [Policy("p", delays=["1s"], dlq_topic="orders.dlq")]\nALLOWED_DESTINATIONS = ["orders*"]',
         "policy 'p': its dlq_topic 'orders.dlq' is also an allowed destination"),
        ('POLICIES = [Policy("p", delay=["1s"])]', "line 2: TypeError: "),
        ('POLICIES = [Policy("p", delays=["1s"]]', "SyntaxError"),
        ('POLICIES = [Policy("p", delays=["1s"])]\nDESTINATIONS = ["orders"]',
         "DESTINATIONS[0] is a str, not a Destination: write Destination('topic', policy=..."),
        ('POLICIES = []\nDESTINATIONS = [Destination("orders", rate_limit=0)]',
         "Destination('orders'): rate_limit=0: give records per second, more than 0"),
        ('POLICIES = []\nDESTINATIONS = [Destination("orders", policy="ghost")]',
         "'orders' maps to undeclared policy 'ghost'"),
        ('POLICIES = []\nDESTINATIONS = [Destination("orders", rate_limit=5), Destination("orders", rate_limit=9)]',
         "destination 'orders' is declared twice with different rate_limit"),
        ('POLICIES = []\nDESTINATIONS = {"orders topic": "default"}',
         "DESTINATIONS['orders topic']: 'orders topic' is neither a valid topic name nor a glob"),
        ("POLICIES = Policy('p', delays=['1s'])", "POLICIES must be a list of Policy(...), not Policy"),
        ('POLICIES = []\nRATE_LIMITS = {"payments": -5}',
         "RATE_LIMITS['payments']: rate_limit=-5: give records per second, more than 0"),
        ('POLICIES = []\nRATE_LIMITS = [("payments", 5)]', "RATE_LIMITS must be a dict of destination (or glob)"),
    ],
)  # fmt: skip
def test_a_policy_mistake_is_one_line_naming_it_and_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, message: str
) -> None:
    module = tmp_path / "retry_policies.py"
    module.write_text(HEAD + body + "\n")
    assert main(["policies", "check", str(module)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"retry-scheduler: {module}") or err.startswith("retry-scheduler: "), err
    assert message in err, err


def test_a_missing_module_says_where_to_set_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policies", "check", str(tmp_path / "nope.py")]) == 2
    assert "does not exist (set RETRY_POLICIES to its path)" in capsys.readouterr().err


def test_a_valid_module_is_shown_as_the_loops_read_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = tmp_path / "retry_policies.py"
    module.write_text(
        HEAD + 'POLICIES = [Policy("pay", backoff=Backoff(base="1s", factor=2, max="10m"), max_attempts=8,\n'
        '                   fatal_errors=["InvalidCard"], dlq_topic="pay.dlq")]\n'
        'DESTINATIONS = {"payments": "pay"}\nALLOWED_DESTINATIONS = ["orders"]\nRATE_LIMITS = {"shop.*": 150}\n'
    )
    assert main(["policies", "check", str(module), "--json"]) == 0
    declared = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in declared["policies"]] == ["default", "pay"]  # default added when not declared
    pay = declared["policies"][1]
    assert (pay["max_attempts"], pay["fatal_errors"], pay["dlq_topic"]) == (8, ["InvalidCard"], "pay.dlq")
    assert declared["allowed_destinations"] == ["orders"]
    shown = {d["destination"]: d for d in declared["destinations"]}
    assert sorted(shown) == ["orders", "payments", "shop.*"]
    assert (shown["payments"]["policy"], shown["payments"]["rate_limit"]) == ("pay", None)
    assert (shown["shop.*"]["policy"], shown["shop.*"]["rate_limit"]) == ("default", 150.0)
    assert main(["policies", "check", str(module)]) == 0
    out = capsys.readouterr().out
    assert f"{module}: valid" in out and "policy pay: backoff 1s x2 up to 10m; at most 8 retries" in out
    assert "  destination shop.*: policy default; at most 150 records/s; rules only (allow=False" in out


def test_each_destination_is_shown_with_its_rules_as_they_resolve_and_where_each_came_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The older dicts and the declarations build the same thing; a topic takes from the most specific
    glob what its own declaration leaves unsaid."""
    module = tmp_path / "retry_policies.py"
    module.write_text(
        HEAD + 'POLICIES = [Policy("pay", delays=["1s"])]\n'
        'DESTINATIONS = [Destination("shop.*", policy="pay", rate_limit=100),\n'
        '                Destination("shop.pay*", rate_limit=50, breaker=Breaker(min_records=5)),\n'
        '                Destination("shop.payments", rate_limit=20)]\n'
    )
    assert main(["policies", "check", str(module), "--json"]) == 0
    shown = {d["destination"]: d for d in json.loads(capsys.readouterr().out)["destinations"]}
    assert list(shown) == ["shop.payments", "shop.pay*", "shop.*"]  # most specific first
    payments = shown["shop.payments"]
    assert (payments["policy"], payments["rate_limit"]) == ("pay", 20)
    assert payments["breaker"].startswith("opens at 50% of >= 5 records")
    assert payments["from"] == {"policy": "shop.*", "breaker": "shop.pay*"}
    assert main(["policies", "check", str(module)]) == 0
    out = capsys.readouterr().out
    assert (
        "  destination shop.payments: policy pay (from shop.*); at most 20 records/s; breaker opens at 50%"
        in out
    )
    assert "(from shop.pay*)" in out


def test_no_policies_module_found_is_an_error_naming_every_place_looked_unless_builtin_is_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a module the package's defaults (which allow no destination) were used silently: every
    record went dead. Now the commands that need policies refuse, naming where they looked, and the
    defaults are there when asked for by name."""
    empty_dags = tmp_path / "airflow-dags"
    empty_dags.mkdir()
    monkeypatch.chdir(tmp_path)  # no ./dags here
    monkeypatch.delenv("RETRY_POLICIES", raising=False)
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(empty_dags))
    for command in (["policies", "check"], ["run", "--seconds", "1"]):
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert (
            "no retry policies module: RETRY_POLICIES is not set and there is no retry_policies.py at " in err
        )
        assert f"{empty_dags}/retry_policies.py, {tmp_path}/dags/retry_policies.py" in err
        assert "or set RETRY_POLICIES=builtin for the package's own" in err
    monkeypatch.setenv("RETRY_POLICIES", "builtin")
    assert main(["policies", "check", "--json"]) == 0
    declared = json.loads(capsys.readouterr().out)
    assert declared["file"].endswith("retry_scheduler/core/default_policies.py")
    assert [p["name"] for p in declared["policies"]] == ["default"] and declared["allowed_destinations"] == []
