"""The ``retry_scheduler`` DAG: every minute, ingest the retry topics into PostgreSQL and publish the due jobs.

Defined in ``retry_scheduler.airflow.dags.retry_scheduler``; this file only places it in the DAGs folder.
"""

from retry_scheduler.airflow.dags.retry_scheduler import retry_scheduler_dag

dag = retry_scheduler_dag()
