"""The ``retry_compaction`` DAG: daily, PySpark: archive processed jobs to Parquet and delete them from PostgreSQL.

Defined in ``retry_scheduler.airflow.dags.retry_compaction``; this file only places it in the DAGs folder.
"""

from retry_scheduler.airflow.dags.retry_compaction import retry_compaction_dag

dag = retry_compaction_dag()
