"""The private stack of a chaos run (PostgreSQL and broker) and the service's loops as OS processes."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from bench.chaos.common import (
    DELIVERY_TIMEOUT_MS,
    INGEST_BATCH,
    INGEST_WORKERS,
    LEASE_MS,
    POLICIES_PATH,
    PUBLISH_BATCH,
    RESTART_DELAY_S,
    ChaosError,
    Say,
)
from bench.chaos.topics import Topics
from retry_scheduler.dev.kafka_cluster import KafkaCluster
from retry_scheduler.dev.postgres_pair import PostgresPair
from retry_scheduler.dev.procs import free_port

log = logging.getLogger(__name__)


class ChaosStack:
    """A PostgreSQL and a broker of our own, in ``work_dir``, for the whole run."""

    TEMPLATE = "chaos_template"

    def __init__(
        self, work_dir: Path, say: Say = print, *, cluster: bool = False, postgres_pair: bool = False
    ) -> None:
        """``cluster``: three Kafka brokers and two controllers only instead of one broker.
        ``postgres_pair``: a PostgreSQL primary and its streaming replica, named both by every URL."""
        self.work_dir, self.say = work_dir, say
        self.pg_port, self.broker_port = free_port(), free_port()
        self.pair: PostgresPair | None = (
            PostgresPair(work_dir / "postgres-pair", dbname=self.TEMPLATE, say=say) if postgres_pair else None
        )
        self.bootstrap = f"127.0.0.1:{self.broker_port}"
        self._pg: subprocess.Popen[bytes] | None = None
        self._broker: subprocess.Popen[bytes] | None = None
        self.cluster: KafkaCluster | None = (
            KafkaCluster(work_dir / "kafka", 3, controllers=2, say=say, first_port=self.broker_port)
            if cluster
            else None
        )
        if self.cluster is not None:
            self.bootstrap = self.cluster.bootstrap

    def url(self, dbname: str) -> str:
        if self.pair is not None:
            return self.pair.url(dbname)
        return f"postgresql://postgres@127.0.0.1:{self.pg_port}/{dbname}"

    def start(self) -> None:
        from retry_scheduler.db.schema import migrate
        from retry_scheduler.dev.broker import start_broker

        # PostgreSQL runs as the postgres account when we are root: it must reach its data dir.
        self.work_dir.chmod(0o755)
        self._start_postgres(self.say)
        migrate(self.url(self.TEMPLATE))
        if self.cluster is not None:
            self.cluster.start()
            return
        self._broker = start_broker(self.broker_port, "127.0.0.1", self.work_dir / "broker.log", self.say)
        if self._broker is None:
            raise ChaosError(f"port {self.broker_port} was taken by another broker meanwhile")

    def _start_postgres(self, say: Say) -> None:
        from retry_scheduler.dev.postgres import ensure_postgres

        if self.pair is not None:
            self.pair.start()
            return
        pg_dir, pg_log = self.work_dir / "postgres", self.work_dir / "postgres.log"
        self._pg = ensure_postgres(self.url(self.TEMPLATE), pg_dir, say, pg_log)
        if self._pg is None:
            raise ChaosError(f"another PostgreSQL answered on port {self.pg_port}: not ours to restart")

    def restart_postgres(self, down_s: float, mode: str) -> None:
        """Stop PostgreSQL (``fast``: SIGINT, ``immediate``: SIGQUIT, crash-like) and start it again."""
        assert self._pg is not None
        self._pg.send_signal(signal.SIGINT if mode == "fast" else signal.SIGQUIT)
        self._pg.wait(60)
        time.sleep(down_s)
        self._start_postgres(log.debug)

    def pause_broker(self, seconds: float) -> None:
        """Freeze the broker (SIGSTOP) for ``seconds``, then let it go on (SIGCONT)."""
        assert self._broker is not None
        os.killpg(self._broker.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.killpg(self._broker.pid, signal.SIGCONT)

    def create_database(self, name: str) -> str:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(self.TEMPLATE)
                )
            )
        return self.url(name)

    def drop_database(self, name: str) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def server_version(self) -> str:
        import psycopg

        with psycopg.connect(self.url("postgres")) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.close()
        if self.pair is not None:
            self.pair.close()
        if self._broker is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._broker.pid, signal.SIGCONT)
                os.killpg(self._broker.pid, signal.SIGKILL)  # memory only: nothing to flush
            self._broker.wait(30)
            self._broker = None
        if self._pg is not None:
            self._pg.send_signal(signal.SIGINT)
            try:
                self._pg.wait(60)
            except subprocess.TimeoutExpired:
                self._pg.kill()
                self._pg.wait(10)
            self._pg = None


# --------------------------------------------------------------------------------------------------
# Workers: the ingest and publish loops as OS processes, restarted when they die


class Worker:
    """One loop (``ingest`` or ``publish``) as an OS process; :meth:`tend` restarts it when it died.

    ``fault`` (a ``RETRY_FAULT`` value) is given to the first process only: the one after it is clean.
    """

    def __init__(self, kind: str, env: dict[str, str], log_path: Path, fault: str | None = None) -> None:
        self.kind, self.env, self.log_path, self.fault = kind, env, log_path, fault
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.exit_codes: list[int] = []
        self._died_at: float | None = None

    def start(self) -> None:
        env = dict(self.env)
        if self.fault and self.starts == 0:
            env["RETRY_FAULT"] = self.fault
        cmd = [
            sys.executable,
            "-m",
            "retry_scheduler.cli.main",
            "run",
            "--only",
            self.kind,
            "--seconds",
            "3600",
        ]
        with open(self.log_path, "ab") as out:
            out.write(f"--- start {self.starts + 1} of the {self.kind} worker\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.starts += 1
        self._died_at = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def fault_fired(self) -> bool:
        """Whether the first process died of SIGKILL (the fault plan's, or ours), or one of its ingest
        worker processes did (the plan is carried out in the worker that reaches the checkpoint)."""
        if not self.exit_codes:
            return False
        if self.exit_codes[0] == -signal.SIGKILL:
            return True
        first_run = self.log_path.read_text(errors="replace").split("--- start 2 ")[0]
        return f"exited with code {-signal.SIGKILL}" in first_run

    def tend(self) -> None:
        """Note a death, and start a new process once it has been dead for ``RESTART_DELAY_S``."""
        if self.proc is None or self.alive:
            return
        if self._died_at is None:
            self._died_at = time.monotonic()
            self.exit_codes.append(self.proc.returncode)
            log.debug("%s worker exited with %s", self.kind, self.proc.returncode)
        elif time.monotonic() - self._died_at >= RESTART_DELAY_S:
            self.start()

    def kill(self) -> None:
        if self.proc is not None and self.alive:
            self.proc.send_signal(signal.SIGKILL)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


class Supervisor:
    """Tends the workers from a background thread, like Airflow scheduling the next run of a task."""

    def __init__(self, workers: Sequence[Worker]) -> None:
        self.workers = workers
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-supervisor", daemon=True)

    def __enter__(self) -> Supervisor:
        for worker in self.workers:
            worker.start()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for worker in self.workers:
                worker.tend()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for worker in self.workers:
            worker.stop()


def worker_env(stack: ChaosStack, database_url: str, topics: Topics, **extra: str) -> dict[str, str]:
    """The environment of a worker process: the service's settings for this trial, nothing inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RETRY_", "KAFKA_", "CHAOS_"))}
    env.update(
        RETRY_DATABASE_URL=database_url,
        KAFKA_BOOTSTRAP_SERVERS=stack.bootstrap,
        RETRY_TOPIC=topics.retry,
        RETRY_CONSUMER_GROUP=f"{topics.prefix}-scheduler",
        RETRY_CREATE_TOPICS="true",
        RETRY_POLICIES=str(POLICIES_PATH),
        CHAOS_DLQ_TOPIC=topics.dlq,
        # The trial's destination is its only allowed one (bench/chaos_policies.py).
        CHAOS_DESTINATION=topics.dest,
        RETRY_INGEST_BATCH=str(INGEST_BATCH),
        RETRY_INGEST_WORKERS=str(INGEST_WORKERS),
        RETRY_PUBLISH_BATCH=str(PUBLISH_BATCH),
        RETRY_LEASE_MS=str(LEASE_MS),
        RETRY_DELIVERY_TIMEOUT_MS=str(DELIVERY_TIMEOUT_MS),
        RETRY_LOOP_GRACE_MS="0",
    )
    env.update(extra)
    return env
