"""The DAGs of the service, as factories: a deployment's DAGs folder holds one thin file per DAG.

Each factory builds its DAG when called, so a DAG file is two lines::

    from retry_scheduler.airflow.dags.retry_scheduler import retry_scheduler_dag

    dag = retry_scheduler_dag()

The DAG belongs to the file that called the factory (its ``fileloc``), so Airflow finds, parses and
runs it from the DAGs folder like any other DAG. Every factory takes the :class:`DagOptions` as
keywords: what a platform team sets on each DAG (``dag_id``, ``owner``, ``pool``, ``queue``,
``tags``, ``access_control``, ``default_args``) and the deployment the DAG works on (its
connections and settings), so that two deployments can run side by side::

    dag = retry_scheduler_dag(
        dag_id="retry_scheduler_eu", pool="kafka", queue="kafka", owner="payments-platform",
        postgres_conn_id="retry_postgres_eu", kafka_conn_id="retry_kafka_eu",
        settings={"RETRY_TOPIC": "retry-eu", "RETRY_CONSUMER_GROUP": "retry-scheduler-eu"},
    )
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from retry_scheduler.airflow.hook import KAFKA_CONN_ID, POSTGRES_CONN_ID, RetrySchedulerHook

if TYPE_CHECKING:
    from airflow.sdk import DAG

#: Settings a factory's ``settings`` may not hold, and the option that gives them instead: they may
#: carry passwords, which belong in a connection (a DAG's arguments show in the UI).
CONNECTION_SETTINGS = {
    "RETRY_DATABASE_URL": "postgres_conn_id",
    "KAFKA_BOOTSTRAP_SERVERS": "kafka_conn_id",
    "RETRY_KAFKA_CONFIG": "kafka_conn_id",
}


@dataclass(frozen=True)
class DagOptions:
    """What a DAG factory takes as keywords; each is optional.

    ``dag_id`` replaces the DAG's id (two deployments side by side need two). ``owner``, ``pool`` and
    ``queue`` go to every task (through the DAG's ``default_args``); ``tags`` are added to the
    service's own; ``access_control`` is the DAG's (Airflow's FAB auth manager); ``default_args`` go
    over the service's (``retries``, ``retry_delay``, ``email``, ``execution_timeout``...), and an
    ``on_failure_callback`` there runs after the service's failure alerts, not instead.
    ``postgres_conn_id`` and ``kafka_conn_id`` name the connections the tasks read (default
    ``retry_postgres`` and ``retry_kafka``); ``settings`` are this deployment's own settings, by the
    names of their environment variables (``RETRY_TOPIC``, ``RETRY_CONSUMER_GROUP``,
    ``RETRY_POLICIES``...), over the environment's: values as strings, as in the environment. Mistakes
    are refused when the DAG file is parsed (an import error in the UI naming the option).
    """

    dag_id: str | None = None
    owner: str | None = None
    pool: str | None = None
    queue: str | None = None
    tags: tuple[str, ...] = ()
    access_control: Mapping[str, Any] | None = None
    default_args: Mapping[str, Any] = field(default_factory=dict)
    postgres_conn_id: str = POSTGRES_CONN_ID
    kafka_conn_id: str = KAFKA_CONN_ID
    settings: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, factory: str, options: Mapping[str, Any]) -> DagOptions:
        """The options a factory was given, checked; ``factory`` names it in the errors."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise TypeError(
                f"{factory}() takes no option {', '.join(unknown)}: its options are {', '.join(known)}"
            )
        for name in ("dag_id", "owner", "pool", "queue", "postgres_conn_id", "kafka_conn_id"):
            value = options.get(name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise TypeError(f"{factory}(): {name} must be a non-empty string, not {value!r}")
        tags = options.get("tags", ())
        if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
            raise TypeError(f"{factory}(): tags must be a list of strings, e.g. tags=[{str(tags)!r}]")
        for name in ("access_control", "default_args", "settings"):
            if options.get(name) is not None and not isinstance(options[name], Mapping):
                raise TypeError(f"{factory}(): {name} must be a dict, not {type(options[name]).__name__}")
        built = cls(**{**options, "tags": tuple(tags)})
        built._check_settings(factory)
        return built

    def _check_settings(self, factory: str) -> None:
        from retry_scheduler.core.config import Settings

        names = Settings.env_names()
        for name, value in self.settings.items():
            if name in CONNECTION_SETTINGS:
                raise ValueError(
                    f"{factory}(): settings may not hold {name}: it belongs in a connection, "
                    f"named by {CONNECTION_SETTINGS[name]}= (a DAG's arguments show in the UI)"
                )
            if name not in names:
                raise ValueError(
                    f"{factory}(): settings has no {name!r}: its keys are the service's environment "
                    f"variables, {', '.join(sorted(names - set(CONNECTION_SETTINGS)))}"
                )
            if not isinstance(value, str):
                raise TypeError(f"{factory}(): settings[{name!r}] must be a string, as in the environment")
        Settings.from_env({**os.environ, **self.settings})  # a malformed value: its setting's own error

    def arguments(self, dag_arguments: dict[str, Any]) -> dict[str, Any]:
        """``dag_arguments`` (a DAG's own) with these options applied."""
        arguments = dict(dag_arguments)
        ours = dict(arguments.get("default_args") or {})
        theirs = dict(self.default_args)
        theirs.update(
            {name: getattr(self, name) for name in ("owner", "pool", "queue") if getattr(self, name)}
        )
        if "on_failure_callback" in theirs:
            extra = theirs.pop("on_failure_callback")
            callbacks = list(ours.get("on_failure_callback") or [])
            callbacks += list(extra) if isinstance(extra, list | tuple) else [extra]
            ours["on_failure_callback"] = callbacks
        arguments["default_args"] = {**ours, **theirs}
        if self.dag_id:
            arguments["dag_id"] = self.dag_id
        arguments["tags"] = [
            *arguments.get("tags", []),
            *(t for t in self.tags if t not in arguments.get("tags", [])),
        ]
        if self.access_control is not None:
            arguments["access_control"] = dict(self.access_control)
        return arguments

    def hook(self) -> RetrySchedulerHook:
        """The hook the DAG's tasks read their settings through: its connections and settings."""
        return RetrySchedulerHook(self.postgres_conn_id, self.kafka_conn_id, self.settings)


def build_dag(
    factory: str,
    options: Mapping[str, Any],
    dag_arguments: dict[str, Any],
    tasks: Callable[[RetrySchedulerHook], None],
) -> DAG:
    """What every factory does: check its ``options`` (:class:`DagOptions`, ``factory`` naming it in
    the errors), make the DAG from its own ``dag_arguments`` with them applied, and lay out its
    ``tasks``, which read their settings through the options' hook when they run. The factory then
    hands the DAG to :func:`in_dag_file` itself (that looks at the factory's caller)."""
    from airflow.sdk import DAG

    chosen = DagOptions.of(factory, options)
    with DAG(**chosen.arguments(dag_arguments)) as built:
        tasks(chosen.hook())
    return built


def default_args(*, retries: int, retry_delay: timedelta) -> dict[str, Any]:
    """What every task of the service's DAGs takes: its owner, its retries, and the failure alerts."""
    from retry_scheduler.airflow.notifiers import failure_notifiers

    return {
        "owner": "retry-scheduler",
        "retries": retries,
        "retry_delay": retry_delay,
        "on_failure_callback": failure_notifiers(),
    }


def utc_intervals(cron: str) -> Any:
    """A schedule whose runs each cover one interval of ``cron`` in UTC (a day, an hour): the data
    interval a run archives or replays, created once the interval is over."""
    try:
        from airflow.sdk import CronDataIntervalTimetable
    except ImportError:  # Airflow 3.1 has it only here
        from airflow.timetables.interval import CronDataIntervalTimetable  # type: ignore[assignment]
    return CronDataIntervalTimetable(cron, timezone="UTC")


def run_failure_callbacks() -> list[Callable[[Any], None]]:
    """What every DAG of the service takes as its own ``on_failure_callback``: the failure alerts of
    its tasks, for a run that fails or outlives its ``dagrun_timeout``."""
    from retry_scheduler.airflow.notifiers import failure_notifiers

    return list(failure_notifiers())


def with_deadline(dag: DAG, after: timedelta | None) -> DAG:
    """Give *dag* a Deadline Alert: a run still going ``after`` its queueing alerts through the
    failure channels (``retry_scheduler.airflow.deadlines``); ``None``: no deadline."""
    if after is not None:
        from retry_scheduler.airflow.deadlines import deadline_alert

        dag.deadline = deadline_alert(after)
    return dag


def in_dag_file(dag: DAG) -> DAG:
    """Give *dag* the file of the factory's caller: the DAG file Airflow parsed, not this package."""
    caller = sys._getframe(2)
    dag.fileloc = caller.f_code.co_filename
    return dag
