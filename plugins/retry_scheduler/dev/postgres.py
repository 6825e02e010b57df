"""PostgreSQL for development: make sure a server answers with the database, starting one if none does."""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any

from retry_scheduler.core.config import libpq_url
from retry_scheduler.db.connection import redact_url
from retry_scheduler.dev.procs import LOCAL_HOSTS, DevStackError, Proc, Say, port_open, spawn, tail, terminate


def with_database(url: str, dbname: str, scheme: str = "postgresql") -> str:
    parts = urllib.parse.urlsplit(libpq_url(url))
    return urllib.parse.urlunsplit((scheme, parts.netloc, "/" + dbname, parts.query, ""))


#: How the comment of every database the dev tooling creates begins; the rest is the folder it was
#: created for (``dev_home()``, or a test suite's checkout). A database that holds tables without it
#: belongs to someone else: the dev stack never migrates, empties or drops it.
DEV_MARK = "created by retry-scheduler dev for"


#: The dev stack's Airflow metadata database, on the server of ``RETRY_DATABASE_URL``, unless
#: ``RETRY_DEV_METADATA_DB`` names another: never ``airflow``, which another Airflow may own.
DEV_METADATA_DB = "retry_scheduler_dev_airflow"


def dev_metadata_db() -> str:
    """``RETRY_DEV_METADATA_DB``, or :data:`DEV_METADATA_DB`."""
    return os.environ.get("RETRY_DEV_METADATA_DB") or DEV_METADATA_DB


def dev_mark(home: Path | None = None) -> str:
    """The comment of the databases made for ``home`` (default: this process's ``dev_home()``)."""
    from retry_scheduler.core.config import dev_home

    return f"{DEV_MARK} {home or dev_home()}"


def mark_database(conn: Any, dbname: str, mark: str | None = None) -> None:
    """Comment database ``dbname`` as the dev tooling's (``conn``: autocommit, any database)."""
    from psycopg import sql

    conn.execute(
        sql.SQL("COMMENT ON DATABASE {} IS {}").format(
            sql.Identifier(dbname), sql.Literal(mark or dev_mark())
        )
    )


def claim_database(database_url: str, what: str, *, also_ours: str | None = None) -> None:
    """Refuse a database that holds tables the dev tooling did not make (``what`` names its use in
    the error); an empty one without the mark gets it. ``also_ours``: a table whose presence makes a
    database ours without the mark (the service's schema in the retry database)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    url = libpq_url(database_url)
    dbname = str(conninfo_to_dict(url).get("dbname") or "")
    with psycopg.connect(make_conninfo(url, connect_timeout=5), autocommit=True) as conn:
        row = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = current_database()"
        ).fetchone()
        if row and (row[0] or "").startswith(DEV_MARK):
            return
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.relkind IN ('r', 'p') AND n.nspname <> 'information_schema'"
                " AND n.nspname NOT LIKE 'pg\\_%' ORDER BY 1"
            )
        ]
        if not tables:
            mark_database(conn, dbname)
            return
        if also_ours and also_ours in tables:
            return
    shown = ", ".join(tables[:3]) + (f" and {len(tables) - 3} more" if len(tables) > 3 else "")
    raise DevStackError(
        f"Database {dbname} at {redact_url(database_url)} holds tables the dev stack did not create "
        f"({shown}): it will not use it as {what}. Use another database (for Airflow's metadata: "
        f"RETRY_DEV_METADATA_DB), or, if it is the dev stack's own from an older release, drop it "
        f"(DROP DATABASE {dbname}) or mark it: COMMENT ON DATABASE {dbname} IS '{dev_mark()}'"
    )


def ensure_database(database_url: str, say: Say = print) -> bool:
    """Create the URL's database (connecting to the ``postgres`` database) if missing, commented as
    the dev tooling's (:func:`dev_mark`); True if created."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    url = libpq_url(database_url)
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
            mark_database(c, dbname)
    except psycopg.errors.DuplicateDatabase:
        return False  # another process created it meanwhile
    except psycopg.Error as exc:
        raise DevStackError(f"Cannot create database {dbname} at {redact_url(database_url)}: {exc}") from None
    say(f"Created database {dbname}")
    return True


def pg_bin_dir() -> Path | None:
    """The folder of the newest PostgreSQL server binaries installed (Debian's ``/usr/lib/postgresql``,
    else ``pg_ctl``'s on the PATH); None when there are none."""

    def version(postgres: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in postgres.parents[1].name.split(".") if x.isdigit())

    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=version, reverse=True)
    on_path = shutil.which("pg_ctl")
    return found[0].parent if found else Path(on_path).resolve().parent if on_path else None


#: The dev server's ``max_connections``: a dev stack holds up to about 30 connections while its DAG
#: runs overlap, so PostgreSQL's default of 100 fits three stacks and the tests' fixtures; 200 fits six
#: (``make test`` runs up to one per worker; each connection costs a few MB only while it is open).
DEV_MAX_CONNECTIONS = 200


def ensure_postgres(
    database_url: str, data_dir: Path, say: Say = print, log_path: Path | None = None
) -> Proc | None:
    """Make sure a server answers at the URL with its database; start a local one if none answers.

    Returns None when a server was already there, else the handle of the postmaster we started. It runs
    in the foreground rather than through ``pg_ctl start``, which detaches it (setsid) from our handle.
    """
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    url = libpq_url(database_url)
    params = conninfo_to_dict(url)
    host, port = str(params.get("host") or "localhost"), int(params.get("port") or 5432)
    try:
        psycopg.connect(make_conninfo(url, dbname="postgres", connect_timeout=3)).close()
        ensure_database(database_url, say)
        return None
    except psycopg.OperationalError as exc:
        if host.startswith("/") or port_open(host, port):
            raise DevStackError(f"PostgreSQL at {redact_url(database_url)} refused us: {exc}") from None
    if host not in LOCAL_HOSTS:
        raise DevStackError(f"No PostgreSQL answers at {redact_url(database_url)}: start it or fix the URL")
    bin_dir = pg_bin_dir()
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
    options = ["-p", str(port), "-k", str(data_dir), "-c", "listen_addresses=127.0.0.1",
               "-c", f"max_connections={DEV_MAX_CONNECTIONS}"]  # fmt: skip
    proc = spawn([str(bin_dir / "postgres"), "-D", str(data_dir), *options], log_path, **as_user)
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
    terminate(proc, "postgres", timeout=10)
    raise DevStackError(f"PostgreSQL did not start on port {port}; {log_path} ends with:\n{tail(log_path)}")


def airflow_migrations_head() -> str | None:
    """The newest migration of the installed Airflow (read from its ``migrations/versions`` scripts,
    without importing Airflow), or None when it cannot be told."""
    import importlib.util

    spec = importlib.util.find_spec("airflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    revisions: set[str] = set()
    parents: set[str] = set()
    for location in spec.submodule_search_locations:
        for script in (Path(location) / "migrations" / "versions").glob("*.py"):
            text = script.read_text(errors="replace")
            revision = re.search(r"^revision\s*=\s*[\"'](\w+)[\"']", text, re.MULTILINE)
            down = re.search(r"^down_revision\s*=\s*(.+)$", text, re.MULTILINE)
            if revision:
                revisions.add(revision[1])
            if down:
                parents.update(re.findall(r"[\"'](\w+)[\"']", down[1]))
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


def airflow_metadata_current(metadata_url: str) -> bool:
    """Whether Airflow's metadata database at ``metadata_url`` is at the installed Airflow's newest
    migration, so that ``airflow db migrate`` (several CPU seconds even when there is nothing to do)
    can be left out. False whenever that cannot be told."""
    import psycopg

    head = airflow_migrations_head()
    if head is None:
        return False
    try:
        with psycopg.connect(libpq_url(metadata_url), connect_timeout=5) as conn:
            versions = [row[0] for row in conn.execute("SELECT version_num FROM alembic_version")]
    except psycopg.Error:
        return False
    return versions == [head]
