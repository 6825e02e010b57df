"""The dev stack's Airflow configuration: secrets of its own, reachable from this machine only."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from retry_scheduler.core.config import Settings
from retry_scheduler.dev.airflow_env import SECRETS_FILE, airflow_env


def test_each_stack_signs_with_its_own_secret_and_keeps_it(tmp_path: Path) -> None:
    one = airflow_env(Settings(), tmp_path / "one", tmp_path / "dags")
    again = airflow_env(Settings(), tmp_path / "one", tmp_path / "dags")
    other = airflow_env(Settings(), tmp_path / "other", tmp_path / "dags")
    for key in ("AIRFLOW__API__SECRET_KEY", "AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__CORE__FERNET_KEY"):
        assert one[key] == again[key] != other[key]  # kept across restarts, never shared
    assert len(one["AIRFLOW__API_AUTH__JWT_SECRET"]) >= 48
    assert stat.S_IMODE((tmp_path / "one" / SECRETS_FILE).stat().st_mode) == 0o600


def test_the_api_server_listens_on_this_machine_only_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RETRY_DEV_API_HOST", raising=False)
    assert airflow_env(Settings(), tmp_path, tmp_path / "dags")["AIRFLOW__API__HOST"] == "127.0.0.1"
    monkeypatch.setenv("RETRY_DEV_API_HOST", "0.0.0.0")
    assert airflow_env(Settings(), tmp_path, tmp_path / "dags")["AIRFLOW__API__HOST"] == "0.0.0.0"


def test_the_stack_s_tasks_allow_the_destinations_its_settings_allow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RETRY_DESTINATION_ALLOWLIST", "from-the-environment")
    given = Settings(destination_allowlist=r"bench\..*")
    assert airflow_env(given, tmp_path, tmp_path / "dags")["RETRY_DESTINATION_ALLOWLIST"] == r"bench\..*"
    plain = airflow_env(Settings(), tmp_path, tmp_path / "dags")
    assert plain["RETRY_DESTINATION_ALLOWLIST"] == "from-the-environment"


def test_a_celery_stack_queues_in_redis_and_keeps_task_states_in_airflow_s_database(tmp_path: Path) -> None:
    from retry_scheduler.cli.dev import EXECUTORS
    from retry_scheduler.dev.airflow_env import celery_env
    from retry_scheduler.dev.stack import DevStack

    env = airflow_env(Settings(), tmp_path / "airflow", Path("dags"), 8080)
    celery = celery_env(env, "redis://127.0.0.1:6390/2")
    assert celery["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert celery["AIRFLOW__CELERY__BROKER_URL"] == "redis://127.0.0.1:6390/2"
    assert celery["AIRFLOW__CELERY__RESULT_BACKEND"] == "db+" + env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert EXECUTORS == DevStack.EXECUTORS  # the CLI's choices, kept apart so --help stays fast
    with pytest.raises(Exception, match="executor 'kubernetes' must be one of local, celery"):
        DevStack(Settings(), executor="kubernetes")
