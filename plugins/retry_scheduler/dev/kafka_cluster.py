"""A Kafka cluster of several nodes on this machine, from the dev broker's artifacts (Apache Kafka 4.4).

Each node is a KRaft broker and controller in one JVM (combined mode), with a listener and a
controller port of its own on loopback; ``controllers`` more nodes are controllers only (a small
JVM each). The nodes share one cluster id and vote as one controller quorum: with three combined
nodes and two controllers only, the quorum (three of five) outlives two brokers stopped at once,
so that the remaining broker shrinks its partitions' in-sync replicas and answers
``NOT_ENOUGH_REPLICAS``, as a cluster whose controllers run apart does. Its internal topics, and the topics created without a replication factor, get three replicas
(the cluster's size when smaller) and ``min.insync.replicas`` 2, as a production cluster runs them
(:func:`~retry_scheduler.dev.broker.server_properties`).

The cluster serves ``retry-scheduler dev up --kafka-brokers 3``, the tests and the chaos harness,
which stop, kill, freeze and restart its nodes while the service runs: each node keeps its ports,
configuration and data across restarts.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from retry_scheduler.dev.broker import (
    DEFAULT_HEAP,
    JVM_OPTIONS,
    LOG4J2,
    START_TIMEOUT_S,
    format_storage,
    java_binary,
    new_cluster_id,
    server_properties,
)
from retry_scheduler.dev.kafka_libs import KAFKA_VERSION, fetch_kafka_libs
from retry_scheduler.dev.procs import DevStackError, Proc, Say, free_port, port_open, spawn, tail, terminate

#: What a node logs when it becomes the metadata quorum's leader, the active controller.
LEADER_LINE = re.compile(
    r"\[RaftManager id=(?P<id>\d+)\] Completed transition to Leader\([^\n]*?\bepoch=(?P<epoch>\d+)"
)
#: A cluster node's heap: three of them share the machine.
CLUSTER_HEAP = "-Xms256m -Xmx768m"
#: A controller-only node's heap: it keeps the cluster's metadata, nothing else.
CONTROLLER_HEAP = "-Xms64m -Xmx256m"


@dataclass
class Node:
    """One node of the cluster: its id, ports, folder and process (None while stopped)."""

    node_id: int
    port: int
    controller_port: int
    home: Path
    proc: Proc | None = None
    #: A voter of the controller quorum only (no listener for clients).
    controller_only: bool = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.home / "kafka.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class KafkaCluster:
    """``size`` brokers and ``controllers`` controllers only under ``root`` (see the module); a context
    manager that stops them all."""

    root: Path
    size: int = 3
    controllers: int = 0
    say: Say = print
    #: The first broker's port (the others take free ports); None: a free one too.
    first_port: int | None = None
    nodes: list[Node] = field(default_factory=list)
    #: The nodes frozen now (:meth:`freeze`, until :meth:`thaw`).
    frozen: set[int] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        if self.size < 1:
            raise DevStackError(f"a Kafka cluster needs at least one node, not {self.size}")
        self.java = java_binary()
        self.classpath = str(fetch_kafka_libs(self.say) / "*")
        self.nodes = [
            Node(
                i,
                self.first_port if i == 1 and self.first_port else free_port(),
                free_port(),
                self.root / f"node-{i}",
                controller_only=i > self.size,
            )
            for i in range(1, self.size + self.controllers + 1)
        ]
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        cluster_id = new_cluster_id(self.java, self.classpath)
        for node in self.nodes:
            node.home.mkdir(parents=True, exist_ok=True)
            (node.home / "server.properties").write_text(
                server_properties(
                    node.home,
                    node.port,
                    node.controller_port,
                    node_id=node.node_id,
                    voters=voters,
                    brokers=self.size,
                    controller_only=node.controller_only,
                )
            )
            (node.home / "log4j2.properties").write_text(LOG4J2)
            format_storage(self.java, self.classpath, node.home, cluster_id)

    @property
    def bootstrap(self) -> str:
        """Every broker's listener, as a client's ``bootstrap.servers``."""
        return ",".join(n.address for n in self.broker_nodes)

    @property
    def broker_nodes(self) -> list[Node]:
        return [n for n in self.nodes if not n.controller_only]

    def node(self, node_id: int) -> Node:
        return self.nodes[node_id - 1]

    def start(self, wait: bool = True, announce: bool = True) -> KafkaCluster:
        """Start every node that is not running (thawing a frozen one); with ``wait``, until each is a
        broker of the cluster; ``announce``: say where it listens."""
        began = time.monotonic()
        for node in self.nodes:
            if not node.running:
                self._spawn(node)
            elif node.proc is not None:
                os.killpg(node.proc.pid, signal.SIGCONT)
        self.frozen.clear()
        if wait:
            self.wait_for_brokers({n.node_id for n in self.broker_nodes})
        if wait and announce:
            self.say(
                f"Apache Kafka {KAFKA_VERSION} (KRaft, {self.size} brokers, {self.size + self.controllers} controllers) listening on {self.bootstrap} "
                f"(up in {time.monotonic() - began:.1f} s; data in {self.root})"
            )
        return self

    def _spawn(self, node: Node) -> None:
        heap = os.environ.get("KAFKA_HEAP_OPTS", CLUSTER_HEAP if self.size > 1 else DEFAULT_HEAP)
        if node.controller_only:
            heap = CONTROLLER_HEAP
        command = [
            self.java, *heap.split(), *JVM_OPTIONS, f"-Dlog4j2.configurationFile={node.home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={node.home}", "-cp", self.classpath, "kafka.Kafka",
            str(node.home / "server.properties"),
        ]  # fmt: skip
        node.proc = spawn(command, node.log_path)

    def wait_for_brokers(self, node_ids: set[int], timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until the cluster's metadata, asked of any running node, lists ``node_ids`` as brokers."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is not None:
                    raise DevStackError(
                        f"Kafka node {node.node_id} exited ({node.proc.returncode}); "
                        f"{node.log_path} ends with:\n{tail(node.log_path)}"
                    )
            if node_ids <= self.brokers(timeout_s=2.0):
                return
            time.sleep(0.2)
        raise DevStackError(
            f"Kafka nodes {sorted(node_ids)} did not all answer as brokers within {timeout_s:.0f} s; "
            + "; ".join(f"{n.log_path} ends with:\n{tail(n.log_path, 10)}" for n in self.nodes)
        )

    def live(self) -> list[str]:
        """The addresses of the brokers that run and are not frozen."""
        return [n.address for n in self.broker_nodes if n.running and n.node_id not in self.frozen]

    def admin(self) -> Any:
        """A new admin client, asking the brokers that run and are not frozen (all of them when none
        does). A client kept from one call to the next could go on asking a frozen broker (its
        connection stays open), and a failover would never seem to end (measured: 6 of 13 freezes in
        a chaos run had no new leader in 30 s)."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": ",".join(self.live()) or self.bootstrap, "log_level": 0})

    def brokers(self, timeout_s: float = 5.0) -> set[int]:
        """The node ids the cluster's metadata lists as brokers now (none when no node answers)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        running = [n.address for n in self.broker_nodes if n.running]
        if not running:
            return set()

        try:
            meta = AdminClient({"bootstrap.servers": ",".join(running), "log_level": 0}).list_topics(
                timeout=timeout_s
            )
        except KafkaException:
            return set()
        return set(meta.brokers)

    def leader(self, topic: str, partition: int = 0, timeout_s: float = 10.0) -> int:
        """The node id that leads ``topic``'s ``partition`` now, as the live brokers see it."""
        if not self.live():
            raise DevStackError("no broker runs unfrozen to ask for a leader")
        meta = self.admin().list_topics(topic, timeout=timeout_s)
        leader = int(meta.topics[topic].partitions[partition].leader)
        if leader < 0:
            raise DevStackError(f"{topic} [{partition}] has no leader now")
        return leader

    def controller(self) -> int:
        """The node id of the active controller, as the nodes' logs last said it (the highest epoch a
        node says it leads the metadata quorum in). The brokers' metadata names a random broker as
        "controller" under KRaft, and the quorum's own API is not in the Python client."""
        best = (-1, -1)
        for node in self.nodes:
            if node.log_path.exists():
                for match in LEADER_LINE.finditer(node.log_path.read_text(errors="replace")):
                    best = max(best, (int(match["epoch"]), int(match["id"])))
        if best[1] < 0:
            raise DevStackError("no node has said it is the active controller yet")
        return best[1]

    def coordinator(self, group: str, timeout_s: float = 10.0) -> int:
        """The node id of ``group``'s coordinator (the leader of its ``__consumer_offsets`` partition)."""
        admin = self.admin()  # kept while the future is pending: a dropped client cancels it
        futures = admin.describe_consumer_groups([group], request_timeout=timeout_s)
        return int(futures[group].result(timeout=timeout_s + 5).coordinator.id)

    def kill(self, node_id: int) -> None:
        """SIGKILL a node (as a machine lost); its data stays for :meth:`restart`."""
        node = self.node(node_id)
        if node.proc is not None:
            os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait(30)
            node.proc = None

    def stop(self, node_id: int) -> None:
        """Stop a node cleanly (SIGTERM: a controlled shutdown moves its leaderships first)."""
        node = self.node(node_id)
        if node.proc is not None:
            terminate(node.proc, f"kafka node {node_id}", timeout=60)
            node.proc = None

    def freeze(self, node_id: int) -> None:
        """SIGSTOP a node: it holds its connections and answers nothing until :meth:`thaw`."""
        node = self.node(node_id)
        if node.proc is not None:
            os.killpg(node.proc.pid, signal.SIGSTOP)
            self.frozen.add(node_id)

    def thaw(self, node_id: int) -> None:
        node = self.node(node_id)
        if node.proc is not None:
            os.killpg(node.proc.pid, signal.SIGCONT)
        self.frozen.discard(node_id)

    def restart(self, node_id: int, wait: bool = True) -> None:
        """Start a stopped or killed node again, with its ports and data."""
        node = self.node(node_id)
        if not node.running:
            self._spawn(node)
        if wait and node.controller_only:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not port_open("127.0.0.1", node.controller_port):
                if time.monotonic() > deadline or not node.running:
                    raise DevStackError(f"controller {node_id} did not listen again; {node.log_path} ends with:\n"
                                        f"{tail(node.log_path)}")  # fmt: skip
                time.sleep(0.2)
        elif wait:
            self.wait_for_brokers({node_id})

    def close(self) -> None:
        """Stop every node (a frozen one is thawed first, so that it can stop)."""
        for node in self.nodes:
            if node.proc is not None:
                if node.proc.poll() is None:
                    os.killpg(node.proc.pid, signal.SIGCONT)
                terminate(node.proc, f"kafka node {node.node_id}", timeout=30)
                node.proc = None

    def __enter__(self) -> KafkaCluster:
        return self

    def __exit__(
        self, _type: type[BaseException] | None, _exc: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()
