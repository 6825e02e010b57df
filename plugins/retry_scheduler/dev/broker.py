"""The dev broker: Apache Kafka 4.4 in KRaft combined mode (one process is broker and controller).

``retry-scheduler dev up``, the demo, the benchmark, the chaos harness and the tests start it on this
machine when ``KAFKA_BOOTSTRAP_SERVERS`` points here and nothing answers. Its storage is formatted
once with the feature level that gives share groups their dead-letter topic (``share.version=2``,
KIP-1191; 4.4's default, asked for by name so a newer default cannot take it away); the broker runs as ``java -cp <jars> kafka.Kafka server.properties`` with its log in the
stack's logs folder, and counts as up when it answers a metadata request naming itself.

Settings that differ from Kafka's defaults, all because there is one broker on a small machine:
replication factor 1 for the internal topics, ``group.initial.rebalance.delay.ms=0`` (a new
group's first members are assigned at once instead of after 3 s), and floors of 6 s and 0.5 s for a
KIP-848 group's own session timeout and heartbeat (its defaults stay 45 s and 5 s). ``KAFKA_HEAP_OPTS`` sizes the heap
as Kafka's own scripts read it (default ``-Xms256m -Xmx1g``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from retry_scheduler.dev.kafka_libs import KAFKA_VERSION, fetch_kafka_libs
from retry_scheduler.dev.procs import (
    DevStackError,
    Proc,
    Say,
    free_port,
    port_open,
    spawn,
    tail,
    terminate,
)

#: How long a broker may take to answer after it was started (about 5 s here, once the JVM is warm).
START_TIMEOUT_S = 90.0
DEFAULT_HEAP = "-Xms256m -Xmx1g"
#: As Kafka's kafka-run-class.sh starts a broker.
JVM_OPTIONS = [
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
]

LOG4J2 = """\
# The dev broker's log: what the broker says at INFO, its busiest loggers at WARN.
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.log.name = kafka.log
logger.log.level = WARN
logger.storage.name = org.apache.kafka.storage
logger.storage.level = WARN
logger.change.name = state.change.logger
logger.change.level = WARN
logger.cluster.name = kafka.cluster
logger.cluster.level = WARN
logger.coordinator.name = org.apache.kafka.coordinator
logger.coordinator.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


def server_properties(
    home: Path,
    port: int,
    controller_port: int,
    host: str = "127.0.0.1",
    *,
    node_id: int = 1,
    voters: str | None = None,
    brokers: int = 1,
    controller_only: bool = False,
) -> str:
    """A node's configuration: broker and controller (combined), a PLAINTEXT listener on
    ``host:port``; or, ``controller_only``, a voter of the controller quorum alone. Alone (``voters``
    None) its internal topics have one replica; in a cluster of ``brokers`` (``voters``: every
    controller's ``id@host:controller_port``) three, or ``brokers`` when fewer, with
    ``min.insync.replicas`` 2 (1 below three), as production runs them."""
    replicas, min_isr = min(3, brokers), 2 if brokers >= 3 else 1
    settings = {
        "process.roles": "controller" if controller_only else "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters or f"{node_id}@{host}:{controller_port}",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(home / "data"),
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(min_isr),
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        "default.replication.factor": str(replicas),
        "min.insync.replicas": str(min_isr),
        "group.initial.rebalance.delay.ms": "0",
        # KIP-848 groups: a group may set its own session and heartbeat (consumer.session.timeout.ms,
        # consumer.heartbeat.interval.ms) below the broker's floors of 45 s and 5 s; the defaults stay.
        "group.consumer.min.session.timeout.ms": "6000",
        "group.consumer.min.heartbeat.interval.ms": "500",
    }
    if controller_only:
        settings.update(listeners=f"CONTROLLER://{host}:{controller_port}")
        settings.pop("advertised.listeners")
        settings.pop("inter.broker.listener.name")
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def java_binary() -> str:
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if java is None or not Path(java).exists():
        raise DevStackError(
            f"The dev broker (Apache Kafka {KAFKA_VERSION}) needs Java 17 or newer: "
            "apt-get install openjdk-17-jre-headless"
        )
    return java


def new_cluster_id(java: str, classpath: str) -> str:
    """A cluster id from Kafka's own tool."""
    return subprocess.run(
        [java, "-cp", classpath, "kafka.tools.StorageTool", "random-uuid"],
        capture_output=True, text=True, check=False,
    ).stdout.strip() or "q1Sh-9_ISia_zwGINzRvyQ"  # fmt: skip


def format_storage(java: str, classpath: str, home: Path, cluster_id: str | None = None) -> None:
    """Format ``home/data`` for a new cluster (``cluster_id``: every node of a cluster shares it),
    once (a formatted folder keeps its topics)."""
    if (home / "data" / "meta.properties").is_file():
        return
    cluster_id = cluster_id or new_cluster_id(java, classpath)
    command = [
        java, "-cp", classpath, f"-Dlog4j2.configurationFile={home / 'log4j2.properties'}",
        "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(home / "server.properties"),
        "--feature", "share.version=2",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise DevStackError(
            f"Formatting the dev broker's storage in {home / 'data'} failed (exit {done.returncode}):\n"
            + (done.stdout + done.stderr)[-3000:]
        )


def broker_answers(bootstrap: str, timeout: float) -> bool:
    """True when a broker at ``bootstrap`` answers a metadata request that names at least one broker."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        meta = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=timeout)
    except KafkaException:
        return False
    return bool(meta.brokers)


def start_broker(
    port: int = 9092,
    host: str = "127.0.0.1",
    log_path: Path | None = None,
    say: Say = print,
    home: Path | None = None,
) -> Proc | None:
    """Start the dev broker on ``host:port``; None when a Kafka broker already answers there.

    ``home`` holds its configuration and data (``home/data``, formatted on first use and kept, so a
    restarted dev stack has its topics); by default a new folder beside ``log_path``, gone with the
    temporary directory it is in.
    """
    bootstrap = f"{host}:{port}"
    if port_open(host, port):
        if broker_answers(bootstrap, 5.0):
            say(f"A Kafka broker already answers at {bootstrap}: reusing it")
            return None
        raise DevStackError(
            f"{bootstrap} is taken by something that is not a Kafka broker: stop it, or "
            "set KAFKA_BOOTSTRAP_SERVERS to a free port"
        )
    java = java_binary()
    classpath = str(fetch_kafka_libs(say) / "*")
    log_path = log_path or Path(tempfile.gettempdir()) / f"kafka-{port}.log"
    if home is None:
        home = log_path.parent / f"kafka-{port}-{uuid.uuid4().hex[:6]}"
    home.mkdir(parents=True, exist_ok=True)
    (home / "server.properties").write_text(server_properties(home, port, free_port(), host))
    (home / "log4j2.properties").write_text(LOG4J2)
    format_storage(java, classpath, home)
    heap = os.environ.get("KAFKA_HEAP_OPTS", DEFAULT_HEAP).split()
    command = [
        java, *heap, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={home / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={log_path.parent}", "-cp", classpath, "kafka.Kafka", str(home / "server.properties"),
    ]  # fmt: skip
    proc = spawn(command, log_path)
    began = time.monotonic()
    while time.monotonic() - began < START_TIMEOUT_S and proc.poll() is None:
        if port_open(host, port) and broker_answers(bootstrap, 2.0):
            say(
                f"Apache Kafka {KAFKA_VERSION} (KRaft, one node) listening on {bootstrap} "
                f"(up in {time.monotonic() - began:.1f} s; data in {home / 'data'})"
            )
            return proc
        time.sleep(0.2)
    terminate(proc, "broker", timeout=15)
    raise DevStackError(
        f"The dev broker (Apache Kafka {KAFKA_VERSION}) did not answer on {bootstrap} within "
        f"{START_TIMEOUT_S:.0f} s; {log_path} ends with:\n{tail(log_path)}"
    )
