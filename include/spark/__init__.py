"""The PySpark jobs, runnable with plain ``spark-submit``; installed as ``retry_scheduler.spark.jobs``."""
