"""The ``dlq_window_replay`` DAG: hourly and paused, for backfills: each run replays the hour's dead jobs.

Defined in ``retry_scheduler.airflow.dags.dlq_window_replay``; this file only places it in the DAGs folder.
"""

from retry_scheduler.airflow.dags.dlq_window_replay import dlq_window_replay_dag

dag = dlq_window_replay_dag()
