"""Run the whole stack on one machine: the dev broker (Apache Kafka 4.4), PostgreSQL and Airflow 3.

``make up`` and the demo use :class:`DevStack`; ``retry_scheduler.dev.airflow_api`` drives the
Airflow it starts, whose environment comes from :mod:`retry_scheduler.dev.airflow_env`.
Children run in their own sessions, so Ctrl-C reaches only us and :meth:`DevStack.stop` takes the
process groups down a tier at a time (SIGTERM, then SIGKILL): the running tasks first, then the
Celery workers, the scheduler with its companions, the api-server, the broker and Redis.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from retry_scheduler.core.config import Settings, dev_home
from retry_scheduler.db.connection import redact_url
from retry_scheduler.dev.airflow_env import (
    airflow_bin,
    airflow_env,
    celery_env,
    fail_orphaned_tasks,
    migrate_airflow_metadata,
)
from retry_scheduler.dev.broker import start_broker
from retry_scheduler.dev.postgres import claim_database, dev_metadata_db, ensure_database, ensure_postgres
from retry_scheduler.dev.procs import (
    LOCAL_HOSTS,
    DevStackError,
    Proc,
    Say,
    kafka_answers,
    port_open,
    spawn,
    tail,
    terminate_all,
)
from retry_scheduler.loops.kafka import ensure_retry_topics

log = logging.getLogger(__name__)

#: How long stopping a stack waits for its running tasks to end before it stops the services.
TASKS_STOP_S = 30.0
#: How long a service that waits for its tasks (the scheduler, a Celery worker) has after SIGTERM
#: before SIGKILL: its tasks were asked to end first, yet on a loaded machine its own shutdown (its
#: executor's processes) has taken over 20 s. The other services get 20 s.
WAITER_STOP_S = 60.0
#: A task still running this long after SIGTERM is sent it again (one still starting up had no
#: handler of the loop's yet: Airflow's own only calls ``on_kill``, and the signal was lost).
TASKS_RESIGNAL_S = 2.0


def _runs_tasks(service: str) -> bool:
    """Whether the stack's ``service`` runs task processes (and waits for them when it stops): the
    scheduler (LocalExecutor) and the Celery workers."""
    return service.startswith(("scheduler", "celery-worker"))


def _stop_tier(service: str) -> int:
    """Which of the stack's services stop together, in turn: the Celery workers (their tasks report
    to the api-server), the scheduler with the dag processor and the triggerer, the api-server, then
    the rest (the broker, Redis)."""
    if service.startswith("celery-worker"):
        return 0
    if service in ("scheduler", "dag-processor", "triggerer"):
        return 1
    return 2 if service == "api-server" else 3


def _running(process: Any) -> bool:
    """Whether a ``psutil`` process runs: ended ones and zombies (their parent not waiting yet) do not."""
    import psutil

    try:
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _end_more_tasks(procs: list[tuple[str, Proc]], signalled: dict[int, float], ended: list[Any]) -> None:
    ended.extend(_end_tasks(procs, signalled))


def _end_tasks(procs: list[tuple[str, Proc]], signalled: dict[int, float]) -> list[Any]:
    """SIGTERM the task processes under ``procs``: new ones at once, the others again every
    ``TASKS_RESIGNAL_S``; returns the new ones (``psutil`` processes). ``signalled``: pid -> when.

    Tasks run under the scheduler (LocalExecutor) and the Celery workers, each in a process group of
    its own; the services' processes lead theirs. (The triggerer's and the dag processor's children
    are not tasks: their services stop them, and the trigger runner does not end on SIGTERM.)"""
    import psutil

    services = {proc.pid for _, proc in procs}
    now, fresh = time.monotonic(), []
    for name, proc in procs:
        if not _runs_tasks(name):
            continue
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children(recursive=True):
                with contextlib.suppress(OSError, psutil.Error):
                    last = signalled.get(child.pid)
                    if os.getpgid(child.pid) in services or (
                        last is not None and now - last < TASKS_RESIGNAL_S
                    ):
                        continue
                    child.terminate()
                    signalled[child.pid] = now
                    if last is None:
                        fresh.append(child)
    return fresh


class DevStack:
    """Broker, PostgreSQL and the Airflow processes of ``make up``, started and stopped together."""

    AIRFLOW_COMMANDS = ("api-server", "scheduler", "dag-processor", "triggerer")
    EXECUTORS = ("local", "celery")

    def __init__(
        self,
        settings: Settings | None = None,
        dags_folder: Path | None = None,
        *,
        api_port: int = 8080,
        metadata_db: str | None = None,
        airflow_home: Path | None = None,
        health_timeout: float = 180.0,
        say: Say = print,
        executor: str = "local",
        redis_url: str | None = None,
        celery_workers: int = 1,
        parse_interval_s: int = 30,
        triggerer: bool = True,
        kafka_brokers: int = 1,
    ) -> None:
        """``executor`` ``celery`` runs tasks on ``celery_workers`` Celery workers (``airflow celery
        worker``) with Redis at ``redis_url`` as the broker (:func:`retry_scheduler.dev.redis.redis_url`
        by default; started here when none answers) instead of the scheduler's LocalExecutor.
        ``parse_interval_s``: see :func:`airflow_env`. ``triggerer=False`` leaves the triggerer out
        (deferred tasks, asset watchers and async deadline callbacks then never run): for a stack whose
        DAGs need none of them, it saves the triggerer's start (about 11 CPU seconds) and its idle load.
        ``kafka_brokers`` above 1 starts a Kafka cluster of that many brokers (and two controllers
        only, from three brokers: :mod:`retry_scheduler.dev.kafka_cluster`) instead of the dev broker;
        the stack's ``KAFKA_BOOTSTRAP_SERVERS`` then names every broker."""
        if executor not in self.EXECUTORS:
            raise DevStackError(f"executor {executor!r} must be one of {', '.join(self.EXECUTORS)}")
        from retry_scheduler.dev.redis import redis_url as default_redis_url

        self.executor, self.celery_workers = executor, celery_workers
        self.parse_interval_s = parse_interval_s
        self.kafka_brokers = kafka_brokers
        self.commands = tuple(c for c in self.AIRFLOW_COMMANDS if triggerer or c != "triggerer")
        self.redis_url = redis_url or default_redis_url()
        self.settings = settings or Settings.from_env()
        self.dags_folder = (dags_folder or Path("dags")).resolve()
        self.api_port, self.metadata_db = api_port, metadata_db or dev_metadata_db()
        self.health_timeout, self.say = health_timeout, say
        self.dev_dir = dev_home()
        self.log_dir = self.dev_dir / "logs"
        #: The dev broker's configuration and data, kept between runs (a stack of its own elsewhere).
        self.kafka_home = self.dev_dir / "kafka"
        self.airflow_home = airflow_home or Path(os.environ.get("AIRFLOW_HOME") or self.dev_dir / "airflow")
        self.base_url = f"http://localhost:{api_port}"
        self.env: dict[str, str] = {}
        self._procs: list[tuple[str, Proc]] = []

    def _adopt(self, name: str, proc: Proc | None) -> None:
        if proc is not None:
            self._procs.append((name, proc))

    def _start_kafka_cluster(self, port: int) -> None:
        """A Kafka cluster of :attr:`kafka_brokers` brokers, its first on ``port``, new at each start."""
        from retry_scheduler.dev.kafka_cluster import KafkaCluster

        home = self.dev_dir / "kafka-cluster"
        shutil.rmtree(home, ignore_errors=True)
        cluster = KafkaCluster(
            home, self.kafka_brokers, controllers=2 if self.kafka_brokers >= 3 else 0, say=self.say,
            first_port=port,
        )  # fmt: skip
        try:
            cluster.start()
        finally:
            for node in cluster.nodes:
                self._adopt(f"kafka node {node.node_id}", node.proc)
        self.settings = self.settings.with_overrides(
            kafka={**self.settings.kafka, "bootstrap.servers": cluster.bootstrap}
        )

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
        if port_open("127.0.0.1", self.api_port):
            raise DevStackError(f"Port {self.api_port} is taken: stop the other Airflow or pick another port")
        host, _, port = self.settings.bootstrap_servers.split(",")[0].rpartition(":")
        if host in LOCAL_HOSTS and self.kafka_brokers > 1:
            self._start_kafka_cluster(int(port))
        elif host in LOCAL_HOSTS:
            broker = start_broker(
                int(port), "127.0.0.1", self.log_dir / "broker.log", self.say, home=self.kafka_home
            )
            self._adopt("broker", broker)
        elif not kafka_answers(self.settings.bootstrap_servers, 10.0):
            raise DevStackError(f"No Kafka broker answers at {self.settings.bootstrap_servers}")
        # The retry topics as the ingest creates them, before anything is sent to them: a first record
        # (the demo's warm-up, an application) would have the broker create one with its default of
        # 1 partition, which one ingest process reads alone.
        ensure_retry_topics(self.settings)
        pg_log = self.log_dir / "postgres.log"
        self._adopt(
            "postgres",
            ensure_postgres(self.settings.database_url, self.dev_dir / "postgres", self.say, pg_log),
        )
        self.env = airflow_env(
            self.settings,
            self.airflow_home,
            self.dags_folder,
            self.api_port,
            metadata_db=self.metadata_db,
            parse_interval_s=self.parse_interval_s,
        )
        if self.executor == "celery":
            from retry_scheduler.dev.redis import ensure_redis

            self._adopt("redis", ensure_redis(self.redis_url, self.log_dir / "redis.log", self.say))
            self.env.update(celery_env(self.env, self.redis_url))
        metadata_url = self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        ensure_database(metadata_url, self.say)
        # Never migrate, or fail the tasks of, another Airflow's metadata; nor fill someone's database.
        claim_database(metadata_url, "Airflow's metadata database")
        claim_database(
            self.settings.database_url, "the retry-scheduler database", also_ours="retry_schema_version"
        )
        from retry_scheduler.db.schema import migrate

        applied = migrate(self.settings.database_url)
        self.say(f"Retry-scheduler schema up to date ({len(applied)} migration(s) applied now)")
        migrate_airflow_metadata(self.env, self.say)
        if self.executor == "celery":
            orphans = fail_orphaned_tasks(self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
            if orphans:
                self.say(f"Failed {orphans} task instance(s) a previous stack left queued or running")
        spawned = datetime.now(UTC)
        for name in self.commands:
            args = [name, "--port", str(self.api_port)] if name == "api-server" else [name]
            self._adopt(name, spawn([airflow_bin(), *args], self.log_dir / f"{name}.log", env=self.env))
        if self.executor == "celery":
            for index in range(self.celery_workers):
                self._spawn_celery_worker(index)
        self._wait_healthy(began, spawned)
        self.say(
            f"Airflow is up after {time.monotonic() - began:.0f} s: {self.base_url} (login admin / admin)"
            + (
                f", tasks on {self.celery_workers} Celery worker(s) through {redact_url(self.redis_url)}"
                if self.executor == "celery"
                else ""
            )
        )
        self.say(f"Logs are in {self.log_dir}")

    def _spawn_celery_worker(self, index: int) -> None:
        name = f"celery-worker-{index}"
        args = ["celery", "worker", "--celery-hostname", f"{name}@%h"]
        if index:  # one log server per host port: the others' task logs are read from the database
            args.append("--skip-serve-logs")
        self._adopt(name, spawn([airflow_bin(), *args], self.log_dir / f"{name}.log", env=self.env))

    def add_celery_workers(self, count: int) -> None:
        """Start ``count`` more Celery workers on the running stack; return once every worker answers
        Celery's ping, so that the tasks queued from then on are shared among them all."""
        if self.executor != "celery":
            raise DevStackError("Only a stack with executor celery has Celery workers to add to")
        for _ in range(count):
            self._spawn_celery_worker(self.celery_workers)
            self.celery_workers += 1
        self.wait_for_celery_workers()

    def wait_for_celery_workers(self) -> None:
        """Wait until each of the stack's Celery workers answers a ping through the broker."""
        from celery import Celery

        app = Celery(broker=self.redis_url)
        deadline = time.monotonic() + self.health_timeout
        try:
            while True:
                self._check_alive()
                answered = len(app.control.ping(timeout=1.0))
                if answered >= self.celery_workers:
                    return
                if time.monotonic() > deadline:
                    raise DevStackError(
                        f"{answered} of {self.celery_workers} Celery workers answer after "
                        f"{self.health_timeout:.0f} s; see the logs in {self.log_dir}"
                    )
        finally:
            app.close()

    def _check_alive(self) -> None:
        for name, proc in self._procs:
            if proc.poll() is not None:
                log_path = self.log_dir / f"{name}.log"
                raise DevStackError(
                    f"{name} exited with code {proc.returncode}; {log_path} ends with:\n{tail(log_path)}"
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
            parts = ("metadatabase", *(c.replace("-", "_") for c in self.commands if c != "api-server"))
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
        # Running tasks first, while the api-server they report to is up: on SIGTERM the loops stop
        # after the round in hand (retry_scheduler.loops.runners.until_terminated). Otherwise the
        # scheduler and the Celery workers wait for them (a retry_scheduler run loops for 90 s).
        # A task that starts meanwhile (the scheduler queues the next run's) is ended as it appears.
        signalled: dict[int, float] = {}
        tasks, deadline = _end_tasks(self._procs, signalled), time.monotonic() + TASKS_STOP_S
        while tasks and time.monotonic() < deadline:
            _, tasks = psutil.wait_procs(tasks, timeout=0.5)
            tasks = [task for task in tasks if _running(task)] + _end_tasks(self._procs, signalled)
        if tasks:
            log.info("%s task process(es) still running %.0f s after SIGTERM", len(tasks), TASKS_STOP_S)
        while self._procs:  # newest first, a tier at a time (_stop_tier)
            tier: list[tuple[str, Proc]] = []
            while self._procs and (not tier or _stop_tier(self._procs[-1][0]) == _stop_tier(tier[0][0])):
                tier.append(self._procs.pop())
            for name, proc in tier:
                log.info("stopping %s (pid %s)", name, proc.pid)
            terminate_all(
                [(name, proc, WAITER_STOP_S if _runs_tasks(name) else 20.0) for name, proc in tier],
                while_waiting=functools.partial(
                    _end_more_tasks, [*tier, *self._procs], signalled, descendants
                ),
            )
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
