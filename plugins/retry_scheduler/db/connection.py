"""Connections to PostgreSQL, with errors that say what to do, and URLs fit to print."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.types import TypeInfo

from retry_scheduler.core.config import libpq_url

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool


class StoreError(RuntimeError):
    """The database cannot be reached or is not migrated; the message says what to do."""


#: The longest any statement of the service may run, in milliseconds (0: no limit).
STATEMENT_TIMEOUT_ENV = "RETRY_STATEMENT_TIMEOUT_MS"
DEFAULT_STATEMENT_TIMEOUT_MS = 300_000


def statement_timeout_ms(env: Mapping[str, str] | None = None) -> int:
    """``RETRY_STATEMENT_TIMEOUT_MS``, default 5 minutes; 0 turns the limit off."""
    raw = (os.environ if env is None else env).get(STATEMENT_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_STATEMENT_TIMEOUT_MS
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise StoreError(f"{STATEMENT_TIMEOUT_ENV}={raw!r} must be a number of milliseconds (0: no limit)")
    return value


def connect(
    database_url: str, *, autocommit: bool = False, statement_timeout: int | None = None
) -> psycopg.Connection[Any]:
    """Open a connection, with an error that says what to check when it fails.

    Every statement on it is cancelled after ``statement_timeout`` ms (default
    :func:`statement_timeout_ms`; 0: never), so that no query of the service, nor a flood of
    searches on the Dead letters page, can hold a connection and its locks for long.
    """
    database_url = libpq_url(database_url)
    try:
        conn = psycopg.connect(database_url, autocommit=autocommit, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise StoreError(_connect_advice(database_url, str(exc).strip())) from exc
    except psycopg.ProgrammingError as exc:
        # Not a URL or DSN libpq can read. Its message quotes the text it choked on, which may be the
        # whole URL with its password: said without it, and without the exception chained.
        error = str(exc).strip().replace(database_url, "the URL")
        if redact_url(database_url) != database_url:
            # It holds a password, and what libpq quotes may be any piece of it (a password with a
            # space or an @ splits where it should not): no quote is repeated.
            error = re.sub(r'"[^"]*"', '"..."', error)
        error = redact_url(error)
        # (a malformed keyword DSN's password may run on past a space: nothing after it is shown)
        shown = re.sub(
            r"(\b(?:ssl)?password\s*=\s*).*", r"\1***", redact_url(database_url), flags=re.I | re.S
        )
        raise StoreError(
            f"RETRY_DATABASE_URL (or the retry_postgres connection) is not a PostgreSQL URL: "
            f"{shown} ({error}). Write it as postgresql://USER:PASSWORD@HOST:5432/DBNAME"
        ) from None
    limit_statements(conn, statement_timeout)
    return conn


def open_pool(url: str, *, size: int, wait_s: float, application_name: str) -> ConnectionPool:
    """A pool of at most ``size`` connections (a request waits ``wait_s`` for one), each with the
    service's statement timeout, opened once the database is checked: it says what is wrong, once
    (no server, no database, no schema).

    A connection is checked as it is handed out (a round trip): one the server dropped meanwhile (a
    failover, a restart) is replaced by a new one, which the URL's ``target_session_attrs`` sends to
    the primary, rather than failing the request it was given to."""
    from psycopg_pool import ConnectionPool  # the page's; the Spark executors have none

    with connect(url) as conn:
        require_migrated(conn, url)
    return ConnectionPool(
        url,
        min_size=1,
        max_size=max(1, size),
        timeout=wait_s,
        kwargs={"application_name": application_name, "connect_timeout": 10},
        configure=limit_statements,
        check=ConnectionPool.check_connection,
        name=application_name,
        open=True,
    )


def limit_statements(conn: psycopg.Connection[Any], limit_ms: int | None = None) -> None:
    """Cancel every later statement on ``conn`` after ``limit_ms`` (default :func:`statement_timeout_ms`;
    0: never), and talk UTF-8 on it. Also what a pool's ``configure`` does to each connection it opens."""
    limit = statement_timeout_ms() if limit_ms is None else limit_ms
    # UTF-8 on the wire whatever the database's encoding: a value that encoding cannot hold is then
    # refused by the server, naming its column, rather than by the client's encoder.
    conn.execute(
        "SELECT set_config('statement_timeout', %s, false), set_config('client_encoding', 'UTF8', false)",
        (str(limit),),
    )
    if not conn.autocommit:
        conn.commit()


def _connect_advice(database_url: str, error: str) -> str:
    try:
        server = conninfo_to_dict(database_url)
    except psycopg.ProgrammingError:
        server = {}
    name = server.get("dbname")
    if name and f'database "{name}" does not exist' in error:
        # The server answers: pointing at the server would send the user the wrong way.
        host, port, user = server.get("host") or "localhost", server.get("port") or "5432", server.get("user")
        createdb = f"createdb -h {host} -p {port}" + (f" -U {user}" if user else "") + f" {name}"
        return (
            f'PostgreSQL answers at {host}:{port} but has no database "{name}": create it ({createdb}, '
            "or `retry-scheduler dev postgres` on a development machine), then run `retry-scheduler db migrate`"
        )
    where = "RETRY_DATABASE_URL or the retry_postgres connection"
    refused = re.search(
        r'(password authentication failed|no password supplied|role "[^"]*" does not exist)', error
    )
    if refused is not None:
        # The server answers and refuses: "is it running?" would send the user the wrong way.
        user = server.get("user") or "(none given)"
        what = "the user" if "role" in refused.group(1) else "the password"
        return (
            f"PostgreSQL at {redact_url(database_url)} refused user {user}: {refused.group(1)}. "
            f"Check {what} in {where}."
        )
    malformed = re.search(
        r'invalid (?:integer )?value "?[^"]*"? for connection option "(\w+)"|invalid \w+ value', error
    )
    if malformed is not None:
        # libpq read the URL but not one of its settings (a port "5432:x", an sslmode "maybe"): the
        # URL is wrong, not the server.
        return (
            f"{where} has a setting libpq cannot use: {redact_url(database_url)} ({error}). "
            "Write it as postgresql://USER:PASSWORD@HOST:5432/DBNAME"
        )
    return (
        f"cannot connect to PostgreSQL at {redact_url(database_url)}: {error}. "
        f"Is it running? Set {where} to a reachable server."
    )


def require_migrated(conn: psycopg.Connection[Any], database_url: str) -> None:
    """Raise a :class:`StoreError` that says to migrate when the database has no retry schema yet.

    Leaves no transaction open. Without it a command on a new database would end in a traceback
    about a missing relation.
    """
    info = TypeInfo.fetch(conn, "retry_job_status")
    if not conn.autocommit:
        conn.rollback()
    if info is None:
        raise StoreError(
            f"the database at {redact_url(database_url)} has no retry_jobs table: "
            "run `retry-scheduler db migrate` first"
        )


#: Up to the last ``@``: a password may hold spaces or an ``@`` a user did not percent-encode.
_URL_PASSWORD = re.compile(r"://([^:/@\s]*):(.*)@")
_PARAM_PASSWORD = re.compile(r"([?&](?:ssl)?password=)[^&#\s]*", re.IGNORECASE)
_KEYWORD_PASSWORD = re.compile(r"(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&#]+)", re.IGNORECASE)


def redact_url(url: str) -> str:
    """The database URL or DSN with every password replaced by ``***``, for messages and logs.

    Covers ``postgresql://user:secret@host/db``, ``...?password=secret`` (and ``sslpassword``), and
    keyword DSNs such as ``host=db password='se cret'``.
    """
    text = _URL_PASSWORD.sub(r"://\1:***@", url)
    text = _PARAM_PASSWORD.sub(r"\1***", text)
    return _KEYWORD_PASSWORD.sub(r"\1***", text)


@contextlib.contextmanager
def joined(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """A transaction of its own, or, inside the caller's, no savepoint: the statements join it.

    A claim and its marks must not each run in a savepoint. A row locked (``FOR UPDATE``) in one
    subtransaction and updated in another gets a MultiXact as its deleter, and an index scan can
    never tell that such an old version is dead: every job published that way left an entry at
    the head of the due index that each later claim walked, resolving the MultiXact on every
    visit, until a VACUUM (claims of 34-41 ms at 2 000 retries/s with autovacuum off). Locked
    and updated by the one transaction, the old version is known dead and its entry is skipped.
    """
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        with conn.transaction():
            yield
    else:
        yield


def require_transaction(conn: psycopg.Connection[Any], what: str) -> None:
    """Refuse ``what`` outside a transaction: the row locks it takes would end at once."""
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        raise StoreError(f"{what} must be called inside a transaction, or its locks end at once")


def database_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the database went away rather than refused the work:
    the connection broke (a failover, a restart, a network cut, a server that ended an idle
    transaction), no server takes connections yet, or the one connected is a standby now.

    A statement cancelled by its timeout is not a loss: the server is there. The loops reconnect
    after a loss (:func:`retry_scheduler.loops.runners.reconnecting`); any other error ends them.
    """
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, psycopg.errors.QueryCanceled):
            return False
        if getattr(cause, "lost_database", False):  # said by another process (an ingest worker)
            return True
        if isinstance(
            cause,
            psycopg.OperationalError
            | psycopg.errors.IdleInTransactionSessionTimeout
            | psycopg.errors.ReadOnlySqlTransaction,
        ):
            return True
        cause = cause.__cause__ or cause.__context__
    return False
