"""A PostgreSQL primary and its streaming replica on loopback, from the machine's binaries: the stand
on which the failover tests and ``chaos --postgres`` kill the primary, promote the replica and bring
the old primary back as the new one's replica.

The service reaches it by one URL naming both servers (:meth:`PostgresPair.url`, libpq's multi-host
form with ``target_session_attrs=read-write``): a new connection finds whichever is the primary.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retry_scheduler.dev.postgres import DEV_MAX_CONNECTIONS, ensure_postgres, pg_bin_dir
from retry_scheduler.dev.procs import DevStackError, Proc, Say, free_port, spawn, tail, terminate

#: The superuser of the pair's servers.
USER = "postgres"


@dataclass
class PgServer:
    """One server of the pair: its port, data folder and postmaster."""

    name: str
    port: int
    data_dir: Path
    proc: Proc | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.name}.log"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{dbname}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _as_postgres() -> dict[str, Any]:
    """PostgreSQL refuses to run as root: then its tools run as the postgres account."""
    if os.geteuid() == 0:
        return {"user": "postgres", "group": "postgres", "extra_groups": [], "cwd": "/"}
    return {}


@dataclass
class PostgresPair:
    """A primary and a streaming replica (asynchronous, or ``synchronous``: a commit waits for the
    replica to have it on disk), each on a free port under ``root``."""

    root: Path
    dbname: str = "retry_scheduler"
    synchronous: bool = False
    say: Say = print
    servers: list[PgServer] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = self.root.resolve()
        if not self.servers:
            self.servers = [PgServer(name, free_port(), self.root / name) for name in ("pg-a", "pg-b")]
        bin_dir = pg_bin_dir()
        if bin_dir is None:
            raise DevStackError("no PostgreSQL binaries found: apt-get install postgresql")
        self.bin_dir = bin_dir
        #: Index into ``servers`` of the primary; the other is its replica.
        self.primary_at = 0

    @property
    def primary(self) -> PgServer:
        return self.servers[self.primary_at]

    @property
    def replica(self) -> PgServer:
        return self.servers[1 - self.primary_at]

    def url(self, dbname: str | None = None) -> str:
        """The service's URL: both servers, a connection taking the one that accepts writes."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.servers)
        return f"postgresql://{USER}@{hosts}/{dbname or self.dbname}?target_session_attrs=read-write"

    def start(self) -> PostgresPair:
        """Start the primary (a new cluster, with the database), then a replica cloned from it."""
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        primary = self.primary
        primary.proc = ensure_postgres(
            primary.dsn(self.dbname), primary.data_dir, say=self.say, log_path=primary.log_path
        )
        self.sql(primary, "ALTER SYSTEM SET wal_keep_size = '256MB'")
        self.sql(primary, f"ALTER SYSTEM SET synchronous_standby_names = '{'*' if self.synchronous else ''}'")
        self.sql(primary, "SELECT pg_reload_conf()")
        self._start_replica(self.replica, primary)
        return self

    def _start_replica(self, replica: PgServer, of: PgServer) -> None:
        """Clone ``of`` into ``replica``'s folder (``pg_basebackup -R``: standby.signal and the
        primary's address written for it) and start it streaming from there."""
        shutil.rmtree(replica.data_dir, ignore_errors=True)
        done = subprocess.run(
            [str(self.bin_dir / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(of.port), "-U", USER,
             "-D", str(replica.data_dir), "-R", "-X", "stream", "--checkpoint=fast"],
            capture_output=True, text=True, **_as_postgres(),
        )  # fmt: skip
        if done.returncode != 0:
            raise DevStackError(f"pg_basebackup from port {of.port} failed: {done.stderr[-2000:]}")
        replica.proc = spawn(
            [str(self.bin_dir / "postgres"), "-D", str(replica.data_dir), "-p", str(replica.port),
             "-k", str(replica.data_dir), "-c", "listen_addresses=127.0.0.1",
             "-c", f"max_connections={DEV_MAX_CONNECTIONS}"],
            replica.log_path, **_as_postgres(),
        )  # fmt: skip
        self.wait_streaming(of, replica)
        self.say(f"PostgreSQL replica on 127.0.0.1:{replica.port} streams from 127.0.0.1:{of.port}")

    def wait_streaming(self, primary: PgServer, replica: PgServer, timeout_s: float = 60.0) -> None:
        """Wait until ``primary`` says a replica streams from it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if replica.proc is not None and replica.proc.poll() is not None:
                break
            with contextlib.suppress(Exception):
                if self.sql(primary, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"):
                    return
            time.sleep(0.2)
        raise DevStackError(
            f"the replica on port {replica.port} did not stream; its log:\n{tail(replica.log_path)}"
        )

    def sql(self, server: PgServer, statement: str, params: tuple[Any, ...] = ()) -> Any:
        """Run one statement on ``server`` (autocommit); the first column of its first row, if any."""
        import psycopg

        with psycopg.connect(server.dsn(), autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(statement, params)
            row = cur.fetchone() if cur.description else None
            return row[0] if row else None

    def cut_replication(self, timeout_s: float = 30.0) -> None:
        """Cut the replica off its primary (its ``primary_conninfo`` pointed nowhere), as a network
        cut or a lagging replica would: the primary's commits from now on reach it no more when
        replication is asynchronous, and wait for it when synchronous. :meth:`rejoin`, after a
        promotion, gives the pair its replica again."""
        replica = self.replica
        self.sql(replica, "ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port=1 connect_timeout=1'")
        self.sql(replica, "SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout_s
        while self.sql(self.primary, "SELECT count(*) FROM pg_stat_replication"):
            if time.monotonic() > deadline:
                raise DevStackError(
                    f"the replica on port {replica.port} still streams {timeout_s} s after the cut"
                )
            time.sleep(0.1)

    def kill_primary(self) -> None:
        """kill -9 the primary's every process (the postmaster and its backends)."""
        proc = self.primary.proc
        assert proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def promote(self, timeout_s: float = 60.0) -> None:
        """Promote the replica (``pg_promote``): it becomes the primary, on a new timeline."""
        replica = self.replica
        if not self.sql(replica, "SELECT pg_promote(true, %s)", (int(timeout_s),)):
            raise DevStackError(f"the replica on port {replica.port} was not promoted within {timeout_s} s")
        self.primary_at = 1 - self.primary_at
        self.say(f"PostgreSQL on 127.0.0.1:{replica.port} promoted")

    def rejoin(self) -> None:
        """Bring the old primary back as the new primary's replica, rebuilt from it (its own last
        commits, if the replica never had them, are gone with its folder)."""
        old = self.replica
        if old.running:
            assert old.proc is not None
            terminate(old.proc, old.name, timeout=20)
        self._start_replica(old, self.primary)

    def replay_gap(self) -> int:
        """Bytes of WAL the primary wrote that the replica has not replayed yet."""
        lsn = self.sql(self.primary, "SELECT pg_current_wal_lsn()::text")
        return int(self.sql(self.primary, "SELECT coalesce(max(pg_wal_lsn_diff(%s::pg_lsn, replay_lsn)), 0)"
                            " FROM pg_stat_replication", (lsn,)))  # fmt: skip

    def close(self) -> None:
        for server in self.servers:
            if server.proc is not None and server.proc.poll() is None:
                terminate(server.proc, server.name, timeout=20)

    def __enter__(self) -> PostgresPair:
        return self if self.primary.running else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
