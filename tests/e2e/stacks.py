"""The dev stack as the end-to-end tests start it: a broker on a free port, the test's database,
Airflow's metadata database kept per checkout (``prefix``), logs under the test's directory."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from retry_scheduler.core.config import Settings
from retry_scheduler.dev.postgres import with_database
from retry_scheduler.dev.procs import free_port
from retry_scheduler.dev.stack import DevStack
from tests.conftest import checkout_database

#: The tests' stacks parse an unchanged DAG file again only after this long (a parse of the folder
#: costs each stack a CPU second): a test that needs the dag processor to look again calls ``reparse``.
PARSE_INTERVAL_S = 600


def reparse(stack: DevStack, dag_file: str) -> None:
    """Have the dag processor parse ``dag_file`` (in the stack's DAGs folder) again at once, as it
    does any file edited since its last parse (it then records, say, a DAG's next run after a backfill)."""
    os.utime(stack.dags_folder / dag_file)


def new_dev_stack(database_url: str, tmp_path: Path, prefix: str, **options: Any) -> DevStack:
    """A DevStack not yet started (``with stack:`` starts and stops it); ``options`` go to DevStack."""
    settings = Settings(database_url=database_url, kafka={"bootstrap.servers": f"127.0.0.1:{free_port()}"})
    stack = DevStack(
        settings,
        api_port=free_port(),
        metadata_db=checkout_database(prefix),
        airflow_home=tmp_path / "airflow",
        **{"say": lambda _message: None, "parse_interval_s": PARSE_INTERVAL_S, **options},
    )
    stack.log_dir = tmp_path / "logs"
    stack.kafka_home = tmp_path / "kafka"  # a broker of its own: a stack on the default port keeps .dev/kafka
    _forget_triggers(with_database(database_url, stack.metadata_db))
    return stack


def _forget_triggers(metadata_url: str) -> None:
    """Drop the triggers an earlier run left in the kept metadata database: their arguments are
    encrypted with that run's Fernet key (each stack has its own), which this run's triggerer cannot
    read (it would exit). A deployment keeps one key, so only the tests meet this."""
    import psycopg

    # (a new metadata database has no trigger table yet: nothing left over)
    with (
        psycopg.connect(metadata_url, autocommit=True) as conn,
        contextlib.suppress(psycopg.errors.UndefinedTable),
    ):
        conn.execute("DELETE FROM trigger")
