"""Operators of the service's DAGs: the Spark job submission every Spark DAG shares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from retry_scheduler.airflow.hook import RetrySchedulerHook
from retry_scheduler.spark.jdbc import jdbc_jars, spark_packages
from retry_scheduler.spark.submit import spark_conf


class RetrySparkSubmitOperator(SparkSubmitOperator):
    """``SparkSubmitOperator`` that hands the job its connections in a private file, at run time.

    When the task runs, it reads ``retry_postgres`` and ``retry_kafka``, writes them to a file only
    the task's user can read (:mod:`retry_scheduler.spark.connection_file`), adds
    ``--connection-file PATH`` to the job's arguments and deletes the file when spark-submit is done.
    No password goes into XCom, the rendered arguments, the logged ``spark-submit`` command or any
    process's command line. The driver therefore runs beside the task: ``deploy-mode`` client
    (Spark's default); a connection asking for ``cluster`` is refused with what to change. When the
    connection's master is a cluster, the executors' Python packages go with the submission
    (:mod:`retry_scheduler.spark.executor_env`).
    """

    def __init__(self, *, retry_hook: RetrySchedulerHook | None = None, **kwargs: Any) -> None:
        """``retry_hook``: the connections and settings the job is given (default: ``retry_postgres``
        and ``retry_kafka``)."""
        super().__init__(**kwargs)
        self.retry_hook = retry_hook or RetrySchedulerHook()

    def add_job_defaults(self) -> None:
        """What every job submission takes, as ``retry-scheduler bulk-retry|compact`` adds it: the JDBC
        driver (``jdbc_jars``) or ``RETRY_SPARK_PACKAGES``, and the class archive's ``--conf``
        (``spark_conf``). At run time: looking for ``java``, the archive and pyspark's version has no
        place in a DAG file's parse. What the task was given is kept."""
        self.jars = self.jars or jdbc_jars()
        self.packages = self.packages or spark_packages()
        self.conf = {**spark_conf(), **(self.conf or {})}

    def execute(self, context: Any) -> None:
        from retry_scheduler.core.config import dev_home
        from retry_scheduler.spark.connection_file import CONNECTION_FILE_OPTION, connection_file
        from retry_scheduler.spark.executor_env import cluster_submit

        self.add_job_defaults()
        if self._get_hook()._connection["deploy_mode"] == "cluster":
            raise ValueError(
                f"{self._conn_id}: the retry-scheduler jobs run their driver beside the task "
                "(deploy-mode client), where it reads its connections from a private file; "
                "remove deploy-mode=cluster from the connection"
            )
        master = self._get_hook()._connection["master"]
        archives, cluster_conf = cluster_submit(master, dev_home() / "spark")
        if archives:  # a cluster: its executors get the jobs' Python packages from the submission
            self._archives = ",".join(filter(None, [self._archives, archives]))
            self.conf = {**(self.conf or {}), **cluster_conf}
        job_args = list(self.application_args or [])
        with connection_file(self.retry_hook.settings()) as path:
            self.application_args = [*job_args, CONNECTION_FILE_OPTION, str(path)]
            self._hook = None  # built again, with the file's path
            try:
                super().execute(context)
            finally:
                self.application_args = job_args
        self._describe_outlets(context, job_args)

    def _get_hook(self) -> SparkSubmitHook:
        """The provider's hook, whose spark-submit runs at ``RETRY_SPARK_LOCAL_NICE`` in local mode
        (through ``nice``: a job that shares the machine with the retry loops takes what they leave;
        the task's own process, which may run other tasks in ``dag.test()``, keeps its priority)."""
        from retry_scheduler.spark.executor_env import niced_if_local

        hook = super()._get_hook()
        build = hook._build_spark_submit_command

        def niced(application: str) -> list[str]:
            return niced_if_local(hook._connection["master"], build(application))

        hook._build_spark_submit_command = niced  # type: ignore[method-assign]
        return hook

    def _describe_outlets(self, context: Any, job_args: list[str]) -> None:
        """Give the task's asset events the job's day and archive (``--day``, ``--archive``), if it has them."""
        extra = {
            name.lstrip("-"): job_args[i + 1]
            for i, name in enumerate(job_args[:-1])
            if name in ("--day", "--archive")
        }
        if extra and self.outlets:
            for outlet in self.outlets:
                context["outlet_events"][outlet].extra = extra


def spark_submit_operator(
    *,
    task_id: str,
    application: Path,
    name: str,
    application_args: Any,
    hook: RetrySchedulerHook | None = None,
    **task_options: Any,
) -> RetrySparkSubmitOperator:
    """The Spark submission of a retry-scheduler DAG, with what every job submission takes.

    The ``spark_default`` connection says where to submit; the JDBC driver (``jdbc_jars``) or
    ``RETRY_SPARK_PACKAGES``, and the class archive of ``make spark-deps`` (``spark_conf``), are
    added when the task runs, as ``retry-scheduler bulk-retry|compact`` adds them
    (:meth:`RetrySparkSubmitOperator.add_job_defaults`). ``application_args`` may be an
    XComArg, resolved at run time; it holds no connection (:class:`RetrySparkSubmitOperator`).
    ``task_options`` are the operator's own (``max_active_tis_per_dag``, ...); ``hook``: the
    connections and settings the job is given (a DAG factory's options).
    """
    return RetrySparkSubmitOperator(
        task_id=task_id,
        application=str(application),
        conn_id="spark_default",
        name=name,
        application_args=application_args,
        retry_hook=hook,
        **task_options,
    )
