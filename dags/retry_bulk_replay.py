"""The ``retry_bulk_replay`` DAG: manual, PySpark: re-publish a large filtered set of jobs.

Defined in ``retry_scheduler.airflow.dags.retry_bulk_replay``; this file only places it in the DAGs folder.
"""

from retry_scheduler.airflow.dags.retry_bulk_replay import retry_bulk_replay_dag

dag = retry_bulk_replay_dag()
