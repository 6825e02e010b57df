"""The dev stack as the end-to-end tests start it: a broker on a free port, the test's database,
Airflow's metadata database kept per checkout (``prefix``), logs under the test's directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from retry_scheduler.core.config import Settings
from retry_scheduler.dev.procs import free_port
from retry_scheduler.dev.stack import DevStack
from tests.conftest import checkout_database


def new_dev_stack(database_url: str, tmp_path: Path, prefix: str, **options: Any) -> DevStack:
    """A DevStack not yet started (``with stack:`` starts and stops it); ``options`` go to DevStack."""
    settings = Settings(database_url=database_url, kafka={"bootstrap.servers": f"127.0.0.1:{free_port()}"})
    stack = DevStack(
        settings,
        api_port=free_port(),
        metadata_db=checkout_database(prefix),
        airflow_home=tmp_path / "airflow",
        **{"say": lambda _message: None, **options},
    )
    stack.log_dir = tmp_path / "logs"
    return stack
