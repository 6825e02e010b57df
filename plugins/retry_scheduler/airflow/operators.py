"""Operators of the service's DAGs: the Spark job submission every Spark DAG shares."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from retry_scheduler.spark.jdbc import jdbc_jars, spark_packages
from retry_scheduler.spark.submit import spark_conf

if TYPE_CHECKING:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator


def spark_submit_operator(
    *, task_id: str, application: Path, name: str, application_args: Any
) -> SparkSubmitOperator:
    """The ``SparkSubmitOperator`` of a retry-scheduler DAG, with what every job submission takes.

    The ``spark_default`` connection says where to submit; the JDBC driver (``jdbc_jars``) or
    ``RETRY_SPARK_PACKAGES``, and the class archive of ``make spark-deps`` (``spark_conf``), are
    added as ``retry-scheduler bulk-retry|compact`` adds them. ``application_args`` may be an
    XComArg, resolved at run time.
    """
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    return SparkSubmitOperator(
        task_id=task_id,
        application=str(application),
        conn_id="spark_default",
        jars=jdbc_jars(),
        conf=spark_conf(),
        packages=spark_packages(),
        name=name,
        application_args=application_args,
    )
