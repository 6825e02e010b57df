# The Spark image of the stack: master, workers and their executors. Spark itself comes from the
# pyspark distribution (its jars and bin/spark-class), at the version the project pins, on the
# same Python minor version as the Airflow image: the executors' Python workers unpickle what the
# driver (in the Airflow worker) sends them, and load binary packages built for that Python.
# The official apache/spark images were not usable here: none for Spark 4.2.0, and Python 3.10.
ARG PYTHON_VERSION=3.11
ARG SPARK_VERSION=4.2.0

FROM python:${PYTHON_VERSION}-slim-bookworm AS wheel
COPY pyproject.toml README.md /tmp/src/
COPY plugins /tmp/src/plugins
COPY include /tmp/src/include
COPY sql /tmp/src/sql
RUN pip wheel --no-deps --wheel-dir /tmp/dist /tmp/src

FROM python:${PYTHON_VERSION}-slim-bookworm
ARG PYTHON_VERSION
ARG SPARK_VERSION
ARG SPARK_UID=50000
RUN apt-get update \
    && apt-get install -y --no-install-recommends default-jre-headless procps tini \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/default-java
COPY --from=wheel /tmp/dist /tmp/dist
# The jobs' Python dependencies and the project (the executors also get them with each submission).
RUN pip install --no-cache-dir "pyspark==${SPARK_VERSION}" \
        "$(ls /tmp/dist/kafka_retry_scheduler-*.whl)[service,spark]" \
    && rm -rf /tmp/dist
# The same uid as the Airflow image's user, group 0: both write the shared archive volume.
RUN useradd --uid "${SPARK_UID}" --gid 0 --home-dir /opt/spark --create-home spark \
    && mkdir -p /opt/spark/work-dir /opt/retry-archive \
    && chown -R "${SPARK_UID}:0" /opt/spark /opt/retry-archive \
    && chmod -R g+rwX /opt/spark /opt/retry-archive
ENV SPARK_HOME=/usr/local/lib/python${PYTHON_VERSION}/site-packages/pyspark \
    SPARK_NO_DAEMONIZE=1 \
    PYSPARK_PYTHON=python3
WORKDIR /opt/spark/work-dir
USER spark
ENTRYPOINT ["/usr/bin/tini", "--"]
