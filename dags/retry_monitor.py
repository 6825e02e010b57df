"""The ``retry_monitor`` DAG: every 5 minutes, check backlog, lateness and DLQ growth and alert once per incident.

Defined in ``retry_scheduler.airflow.dags.retry_monitor``; this file only places it in the DAGs folder.
"""

from retry_scheduler.airflow.dags.retry_monitor import retry_monitor_dag

dag = retry_monitor_dag()
