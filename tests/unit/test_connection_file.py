"""The connection file: how jobs get their passwords without a command line showing them."""

from __future__ import annotations

import argparse
import json
import os
import stat
from pathlib import Path

import pytest

from retry_scheduler.core.config import ConfigError, Settings
from retry_scheduler.spark.connection_file import (
    add_connection_options,
    connection_file,
    job_settings,
    read_connection_file,
)

SECRET = "s3cr3t-Pa55"
SETTINGS = Settings(
    database_url=f"postgresql://svc:{SECRET}@db.example:5432/retry",
    kafka={"bootstrap.servers": "k1:9092", "security.protocol": "SASL_SSL", "sasl.password": SECRET},
)


def parse(argv: list[str], *, kafka: bool = True) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_connection_options(parser, kafka=kafka)
    return parser.parse_args(argv)


def test_the_file_is_private_holds_the_connections_and_is_gone_afterwards() -> None:
    with connection_file(SETTINGS) as path:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        read = read_connection_file(path, Settings())
        assert read.database_url == SETTINGS.database_url
        assert read.kafka == SETTINGS.kafka
    assert not path.exists() and not path.parent.exists()


def test_a_job_reads_the_file_then_its_bootstrap_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RETRY_KAFKA_CONFIG", raising=False)
    with connection_file(SETTINGS) as path:
        settings = job_settings(parse(["--connection-file", str(path), "--bootstrap-servers", "other:9092"]))
    assert settings.database_url == SETTINGS.database_url
    assert settings.kafka["sasl.password"] == SECRET
    assert settings.bootstrap_servers == "other:9092"


def test_without_a_file_a_job_takes_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRY_DATABASE_URL", "postgresql://env@h/db")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "envk:9092")
    monkeypatch.setenv("RETRY_KAFKA_CONFIG", json.dumps({"sasl.username": "u", "sasl.password": SECRET}))
    settings = job_settings(parse([], kafka=False))
    assert settings.database_url == "postgresql://env@h/db"
    assert settings.kafka == {"bootstrap.servers": "envk:9092", "sasl.username": "u", "sasl.password": SECRET}


def test_a_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"database_url": SETTINGS.database_url}))
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="readable by other users") as err:
        read_connection_file(path, Settings())
    assert SECRET not in str(err.value)


@pytest.mark.parametrize(
    "content",
    [f"not json {SECRET}", json.dumps([SECRET]), json.dumps({"database_url": "x", "kafka": {"a": [SECRET]}})],
)
def test_a_broken_file_is_refused_without_repeating_it(tmp_path: Path, content: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(content)
    os.chmod(path, 0o600)
    with pytest.raises(ConfigError) as err:
        read_connection_file(path, Settings())
    assert str(path) in str(err.value) and SECRET not in str(err.value)


def test_a_missing_file_says_which(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read the connection file .*nope\.json"):
        read_connection_file(tmp_path / "nope.json", Settings())


@pytest.mark.parametrize("raw", [f'{{"sasl.password": "{SECRET}"', f'["{SECRET}"]'])
def test_retry_kafka_config_errors_do_not_repeat_it(raw: str) -> None:
    with pytest.raises(ConfigError, match="RETRY_KAFKA_CONFIG") as err:
        Settings.from_env({"RETRY_KAFKA_CONFIG": raw})
    assert SECRET not in str(err.value)


def test_settings_never_show_their_passwords() -> None:
    shown = repr(SETTINGS) + str(SETTINGS)
    assert SECRET not in shown and "retry_topic='retry'" in shown
