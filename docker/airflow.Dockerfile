# The Airflow image of the stack: the official image, a Java runtime for spark-submit (the jobs'
# drivers run in the Celery worker, client mode), the PostgreSQL JDBC driver, and this project's
# wheel with its airflow and spark extras (pyspark pinned by the wheel: the same Spark as
# docker/spark.Dockerfile). Built by `docker compose build` from the repository root.
ARG AIRFLOW_VERSION=3.3.2
ARG PYTHON_VERSION=3.11

FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION} AS wheel
COPY --chown=airflow:0 pyproject.toml README.md /tmp/src/
COPY --chown=airflow:0 plugins /tmp/src/plugins
COPY --chown=airflow:0 include /tmp/src/include
COPY --chown=airflow:0 sql /tmp/src/sql
RUN pip wheel --no-deps --wheel-dir /tmp/dist /tmp/src

FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}
ARG AIRFLOW_VERSION
USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends default-jre-headless libpostgresql-jdbc-java \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/default-java
# Mount points of the compose stack's volumes, owned by the image's user and writable by group 0 (an
# arbitrary AIRFLOW_UID runs with gid 0): a new named volume takes this ownership.
RUN mkdir -p /opt/retry-archive /opt/airflow/retry-scheduler \
    && chown -R airflow:0 /opt/retry-archive /opt/airflow/retry-scheduler \
    && chmod -R g+rwX /opt/retry-archive /opt/airflow/retry-scheduler
USER airflow
COPY --from=wheel /tmp/dist /tmp/dist
# Airflow pinned to the image's own version, as the official image's docs ask of added packages.
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" \
        "$(ls /tmp/dist/kafka_retry_scheduler-*.whl)[airflow,spark]"
