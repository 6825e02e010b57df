"""What the dev stack's Airflow processes run with: their environment, secrets and metadata database.

:func:`airflow_env` is the whole environment of a dev stack's Airflow (settings, connections, the
stack's own secrets); :func:`airflow_cli` runs ``airflow`` with it; :func:`migrate_airflow_metadata`
brings its metadata database to the installed Airflow. :class:`retry_scheduler.dev.stack.DevStack`
and the tests' fixtures use them.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

from retry_scheduler.core.config import Settings, dev_home, libpq_url
from retry_scheduler.dev.postgres import (
    airflow_metadata_current,
    airflow_migrations_head,
    dev_metadata_db,
    mark_database,
    with_database,
)
from retry_scheduler.dev.procs import DevStackError, Say

# Dev-only secrets, fixed so that every Airflow process (and every restart) agrees on them; the JWT
# secret needs 64+ bytes for HS512 or PyJWT warns on every token.
#: Where a dev stack keeps the secrets it generated for itself (in its Airflow home, mode 0600).
SECRETS_FILE = "retry-dev-secrets.json"


def stack_secrets(airflow_home: Path) -> dict[str, str]:
    """The secrets of the dev stack in ``airflow_home``: generated on its first start, then kept.

    ``secret``: the api-server's session and token signing key; ``fernet_key``: Airflow's key for the
    connections it stores. Each stack has its own (no constant a token could be forged with), and
    they survive restarts so that logins and stored connections stay valid.
    """
    path = airflow_home / SECRETS_FILE
    try:
        found = json.loads(path.read_text())
        if isinstance(found, dict) and {"secret", "fernet_key"} <= set(found):
            return {"secret": str(found["secret"]), "fernet_key": str(found["fernet_key"])}
    except (OSError, ValueError):
        pass
    made = {
        "secret": secrets.token_urlsafe(48),
        "fernet_key": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
    }
    airflow_home.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(made, out)
    return made


def airflow_env(
    settings: Settings,
    airflow_home: Path,
    dags_folder: Path,
    api_port: int = 8080,
    *,
    metadata_db: str | None = None,
    parse_interval_s: int = 30,
) -> dict[str, str]:
    """The whole environment for Airflow processes; writes the passwords file that makes admin/admin.

    ``parse_interval_s``: how often the dag processor parses an unchanged DAG file again (Airflow's
    ``min_file_process_interval``); a file edited since its last parse is parsed at once whatever it
    says (Airflow's ``modified_time`` order), new files within 5 s. Each parse of the DAGs folder costs
    about a CPU second: at 10 s that was a fifth of a core for as long as the stack ran.

    The plugin comes from the installed package (its ``airflow.plugins`` entry point), so the plugins
    folder is an empty one of its own.
    """
    airflow_home.mkdir(parents=True, exist_ok=True)
    (airflow_home / "plugins").mkdir(exist_ok=True)
    keys = stack_secrets(airflow_home)
    passwords = airflow_home / "simple_auth_manager_passwords.json"
    # A second user, to approve a replay that waits for a second person (RETRY_REPLAY_APPROVAL_ABOVE).
    passwords.write_text(json.dumps({"admin": "admin", "approver": "approver"}) + "\n")
    # The log servers default to 8793/8794: move them along with the API port so two stacks can coexist.
    log_port = 8793 if api_port == 8080 else api_port + 1
    config = {
        "core.dags_folder": dags_folder.resolve(),
        "core.plugins_folder": airflow_home / "plugins",
        "core.load_examples": False,
        "core.executor": "LocalExecutor",
        "core.parallelism": 8,
        "core.max_active_tasks_per_dag": 8,
        "core.fernet_key": keys["fernet_key"],
        "core.auth_manager": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "core.simple_auth_manager_users": "admin:admin,approver:op",
        "core.simple_auth_manager_all_admins": False,
        "core.simple_auth_manager_passwords_file": passwords,
        "core.execution_api_server_url": f"http://127.0.0.1:{api_port}/execution/",
        "database.sql_alchemy_conn": with_database(
            settings.database_url, metadata_db or dev_metadata_db(), "postgresql+psycopg2"
        ),
        "dag_processor.refresh_interval": 5,
        "dag_processor.min_file_process_interval": parse_interval_s,
        "api.base_url": f"http://localhost:{api_port}",
        # Only this machine reaches the dev stack's UI and API unless RETRY_DEV_API_HOST says otherwise.
        "api.host": os.environ.get("RETRY_DEV_API_HOST") or "127.0.0.1",
        "api.port": api_port,
        "api.workers": 1,
        "api.secret_key": keys["secret"],
        "api_auth.jwt_secret": keys["secret"],
        "logging.worker_log_server_port": log_port,
        "logging.trigger_log_server_port": log_port + 1,
    }
    env = dict(os.environ)
    env.update(
        {"AIRFLOW__{}__{}".format(*key.upper().split(".")): str(value) for key, value in config.items()}
    )
    env.update(_service_env(settings, airflow_home, env))
    return env


def _service_env(settings: Settings, airflow_home: Path, env: dict[str, str]) -> dict[str, str]:
    """What the stack's Airflow processes need of the service: its connections (PostgreSQL, the broker,
    the dead-letter watcher's group, Spark) and settings; ``env``: the environment so far."""
    return {
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW_CONN_RETRY_POSTGRES": libpq_url(settings.database_url),
        "AIRFLOW_CONN_RETRY_KAFKA": json.dumps(
            {"conn_type": "kafka", "extra": {**settings.kafka, "session.timeout.ms": 6000}}
        ),
        # The dead-letter watcher's consumer (retry_scheduler.airflow.dead_letters): a group of its
        # own; from the earliest record, as the dev broker starts empty.
        "AIRFLOW_CONN_RETRY_DLQ_WATCH": json.dumps(
            {
                "conn_type": "kafka",
                "extra": {
                    **settings.kafka,
                    "group.id": "retry-dlq-watch",
                    "auto.offset.reset": "earliest",
                },
            }
        ),
        # conn_type spark with host "local[*]": the Spark hook then takes the host as the master.
        "AIRFLOW_CONN_SPARK_DEFAULT": "spark://local%5B%2A%5D?deploy-mode=client",
        "RETRY_DATABASE_URL": settings.database_url,
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        # The destinations the given settings add to the policies module's (empty: the environment's).
        "RETRY_DESTINATION_ALLOWLIST": settings.destination_allowlist
        or env.get("RETRY_DESTINATION_ALLOWLIST", ""),
        # The dev broker starts empty: destination and DLQ topics are created on first use.
        "RETRY_CREATE_TOPICS": "true",
        # Every process agrees on the dev home (Spark's class archive, the Parquet archive).
        "RETRY_DEV_HOME": str(dev_home()),
        "PATH": os.pathsep.join(filter(None, [str(Path(sys.executable).parent), env.get("PATH")])),
    }


def celery_env(env: dict[str, str], broker_url: str) -> dict[str, str]:
    """Airflow settings that run tasks on Celery workers, with ``broker_url`` (Redis) as the broker.

    Task states go back through Airflow's metadata database (Celery's database result backend), so
    nothing but the queue lives in Redis.
    """
    metadata = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    return {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CELERY__BROKER_URL": broker_url,
        "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{metadata}",
        # Up to three retry_scheduler runs overlap, two loops each, beside the other DAGs' tasks.
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": "8",
    }


def fail_orphaned_tasks(metadata_url: str) -> int:
    """Fail the task instances a stopped stack left queued or running; returns how many.

    Their processes died with that stack, but a Celery executor adopts them by their Celery task id
    and keeps a worker slot for each until Airflow's timeouts (minutes) give up on them, so a
    restarted stack would run short of slots. Only for the dev stack's own metadata database, before
    its scheduler starts.
    """
    import psycopg

    with psycopg.connect(libpq_url(metadata_url), autocommit=True) as conn:
        done = conn.execute(
            "UPDATE task_instance SET state = 'failed', end_date = now()"
            " WHERE state IN ('queued', 'running', 'restarting', 'up_for_retry', 'deferred')"
        )
        return done.rowcount


def airflow_bin() -> str:
    beside = Path(sys.executable).parent / "airflow"
    return str(beside) if beside.exists() else shutil.which("airflow") or "airflow"


def airflow_cli(
    args: list[str], env: dict[str, str], *, timeout: float | None = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``airflow ARGS`` with ``env``; DevStackError with the output's tail when it fails."""
    done = subprocess.run([airflow_bin(), *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        output = (done.stdout + done.stderr)[-3000:]
        raise DevStackError(f"`airflow {' '.join(args)}` failed with exit code {done.returncode}:\n{output}")
    return done


def migrate_airflow_metadata(env: dict[str, str], say: Say = lambda _message: None) -> None:
    """Bring ``env``'s metadata database to the installed Airflow's newest migration.

    Nothing is run when it is there already (``airflow db migrate`` costs several CPU seconds even
    then). An empty database becomes a copy of the migrated template (:data:`TEMPLATE_PREFIX`, made
    by the first stack that needs it): a copy takes a fraction of a second where migrating an empty
    database costs about 10 CPU seconds. A database with tables (an older Airflow's, say) is
    migrated in place, as is any the server will not copy (no CREATEDB right, say).
    """
    metadata_url = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    if airflow_metadata_current(metadata_url):
        say("Airflow's metadata database is up to date")
        return
    if _copy_of_template(metadata_url, env, say):
        return
    say("Migrating the Airflow metadata database")
    airflow_cli(["db", "migrate"], env, timeout=900)


#: Name prefix of the migrated metadata databases that new ones are copied from, one per Airflow
#: migration head (the newest replaces the others). Only the dev stacks' servers hold one.
TEMPLATE_PREFIX = "retry_airflow_template_"
#: The advisory lock under which the template is made and copied (two stacks starting at once).
_TEMPLATE_LOCK = 0x7265_7472_7954_706C  # "retryTpl"


def _copy_of_template(metadata_url: str, env: dict[str, str], say: Say) -> bool:
    """Replace the empty database of ``metadata_url`` by a copy of the template (migrating the
    template first when it is missing or behind); False, with the database as it was, when it is not
    empty or the server refuses (the caller migrates it in place then)."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    head, url = airflow_migrations_head(), libpq_url(metadata_url)
    dbname = str(conninfo_to_dict(url).get("dbname") or "")
    if head is None or not dbname or dbname.startswith(TEMPLATE_PREFIX):
        return False
    template, staged = f"{TEMPLATE_PREFIX}{head}".lower(), f"{dbname[:40]}_copy_{secrets.token_hex(4)}"

    def ident(name: str) -> sql.Composable:
        return sql.Identifier(name)

    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            tables = conn.execute(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%'"
            ).fetchone()
        if tables is None or tables[0]:
            return False
        with psycopg.connect(
            make_conninfo(url, dbname="postgres", connect_timeout=5), autocommit=True
        ) as admin:
            admin.execute("SELECT pg_advisory_lock(%s)", (_TEMPLATE_LOCK,))  # released when it closes
            if not airflow_metadata_current(with_database(url, template)):
                say(f"Migrating the Airflow metadata template {template} (new databases are copies of it)")
                stale = admin.execute(
                    "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", (TEMPLATE_PREFIX,)
                ).fetchall()
                for (name,) in stale:
                    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident(name)))
                admin.execute(sql.SQL("CREATE DATABASE {}").format(ident(template)))
                mark_database(admin, template)
                template_env = {
                    **env,
                    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": with_database(
                        url, template, "postgresql+psycopg2"
                    ),
                }
                airflow_cli(["db", "migrate"], template_env, timeout=900)
            # Copied under another name first: the database is only replaced once its copy exists.
            admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(ident(staged), ident(template)))
            row = admin.execute(
                "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s", (dbname,)
            ).fetchone()
            try:
                admin.execute(sql.SQL("DROP DATABASE {}").format(ident(dbname)))
            except psycopg.Error:
                admin.execute(sql.SQL("DROP DATABASE {}").format(ident(staged)))
                raise
            admin.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(ident(staged), ident(dbname)))
            if row and row[0]:  # its comment (the tests' checkout databases name their checkout in it)
                admin.execute(
                    sql.SQL("COMMENT ON DATABASE {} IS {}").format(ident(dbname), sql.Literal(row[0]))
                )
    except (psycopg.Error, DevStackError) as exc:
        say(f"Could not copy the Airflow metadata template ({str(exc).strip()[:300]}): migrating instead")
        return False
    say(f"Airflow's metadata database is a copy of {template}")
    return True
