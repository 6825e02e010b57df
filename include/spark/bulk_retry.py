"""Bulk retry: re-publish a large filtered set of ``retry_jobs`` to their destinations (PySpark).

For example every dead job of a destination after its outage::

    export RETRY_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/retry_scheduler
    export KAFKA_BOOTSTRAP_SERVERS=localhost:9092 RETRY_KAFKA_CONFIG='{}'   # librdkafka settings as JSON
    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit --master 'local[2]' \\
        --jars /usr/share/java/postgresql.jar include/spark/bulk_retry.py --destination orders --dry-run

The connections come from that environment or from ``--connection-file`` (what the DAG and
``retry-scheduler bulk-retry`` pass), never from the command line, where every user could read a password.

The driver counts the selection with one small parameterised query (per destination, with the
lowest and highest id), then the executors read it over JDBC in parallel id ranges, hand it to
their Python workers as Arrow batches (``mapInArrow``), and each partition produces its rows with
one idempotent producer (``acks=all``), with exactly the headers
of the normal publish path (``retry.attempt`` raised, ``retry.id`` kept, the rest byte for byte).
While a partition produces, a thread of its worker marks the acknowledged jobs published, a
``--mark-batch`` of them per transaction (one ``UPDATE`` each, on the worker's own connection), so
PostgreSQL writes the new row versions while Python builds records. Only acknowledged jobs are
marked. A crash leaves the jobs of the batches not yet committed dead (or pending): a re-run
selects only those and re-publishes them, with the same ``retry.id`` and ``retry.attempt``
(at-least-once; at most a few batches per running partition are published twice).

Python: pip's spark-submit finds Spark, and runs the driver, with ``python3`` from PATH unless
``PYSPARK_PYTHON`` (or ``--conf spark.pyspark.python=...``) names another: activate the venv or set
it as above; the driver needs confluent-kafka and psycopg. Spark merges the Python driver's stderr
(progress, counts) into its stdout; the last line is the result as JSON. Exit status: 0, 1 when
some deliveries failed (those jobs are left as they were: run again), 2 for invalid arguments.

The driver and the executors import ``retry_scheduler`` (the job's code is
:mod:`retry_scheduler.spark.bulk_retry`): the Python that runs them must have the package installed.
On a cluster use ``--conf spark.jars.packages=org.postgresql:postgresql:42.7.4`` instead of
``--jars``.
"""

from __future__ import annotations

import sys

try:
    from retry_scheduler.spark.bulk_retry import run
except ImportError as exc:  # pragma: no cover - depends on how the job is launched
    raise SystemExit(
        f"bulk_retry cannot import {exc.name} in {sys.executable}: run it with the Python that has "
        "kafka-retry-scheduler installed, e.g. PYSPARK_PYTHON=.venv/bin/python spark-submit ... "
        "(or --conf spark.pyspark.python=...)"
    ) from exc

if __name__ == "__main__":
    sys.exit(run())
