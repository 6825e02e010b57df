"""The ``retry_scheduler`` DAG: every minute, ingest the retry topics into PostgreSQL and publish the due jobs.

Defined in ``retry_scheduler.airflow.dags.retry_scheduler``; this file only places it in the DAGs folder.
Not named ``retry_scheduler.py``: Airflow puts the DAGs folder on ``sys.path``, where a file of that
name would hide the ``retry_scheduler`` package from every DAG file parsed before the package is imported.
"""

from retry_scheduler.airflow.dags.retry_scheduler import retry_scheduler_dag

dag = retry_scheduler_dag()
