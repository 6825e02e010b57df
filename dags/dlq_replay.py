"""The ``dlq_replay`` DAG: manual, with a form: replay or purge dead jobs by filter, with dry run.

Defined in ``retry_scheduler.airflow.dags.dlq_replay``; this file only places it in the DAGs folder.
"""

from retry_scheduler.airflow.dags.dlq_replay import dlq_replay_dag

dag = dlq_replay_dag()
