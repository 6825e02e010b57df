"""A Spark standalone cluster on this machine: a master and workers, each its own JVM, from pyspark.

``retry-scheduler dev spark-cluster`` (and the cluster tests) start it with the ``spark-class``
launcher of the installed pyspark, which runs ``org.apache.spark.deploy.master.Master`` and
``org.apache.spark.deploy.worker.Worker`` as Spark's own ``start-master.sh`` would. Every part
listens on 127.0.0.1 on free ports; a worker starts its executors as processes of their own, in
its work directory. Jobs reach it as ``spark://127.0.0.1:PORT`` (``--master``,
``RETRY_SPARK_MASTER`` or the ``spark_default`` connection).
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retry_scheduler.dev.procs import DevStackError, Proc, Say, free_port, spawn, tail, terminate

log = logging.getLogger(__name__)

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_class() -> Path:
    """The ``spark-class`` launcher of the installed pyspark."""
    import pyspark

    path = Path(pyspark.__file__).resolve().parent / "bin" / "spark-class"
    if not path.is_file():
        raise DevStackError(f"no spark-class in the installed pyspark ({path}): reinstall pyspark")
    return path


@dataclass
class SparkCluster:
    """A running master and its workers; :meth:`stop` ends them (and the executors they started)."""

    work_dir: Path
    master_port: int
    master_ui_port: int
    procs: list[tuple[str, Proc]] = field(default_factory=list)

    @property
    def url(self) -> str:
        """What ``--master`` takes."""
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.master_ui_port}"

    def status(self) -> dict[str, Any]:
        """The master's JSON status (workers, running and completed applications)."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as answer:
            return dict(json.load(answer))

    def stop(self) -> None:
        for name, proc in reversed(self.procs):
            terminate(proc, name, timeout=15)
        self.procs.clear()

    def __enter__(self) -> SparkCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # Master and workers are plain JVMs: no PySpark driver settings of the caller leak into them.
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME"):
        env.pop(name, None)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def start_cluster(
    work_dir: Path,
    *,
    workers: int = 1,
    cores: int = 2,
    memory: str = "2g",
    say: Say = log.info,
    timeout_s: float = 90,
) -> SparkCluster:
    """Start a master and ``workers`` workers (``cores`` and ``memory`` each); wait until all registered."""
    work_dir.mkdir(parents=True, exist_ok=True)
    launcher = str(spark_class())
    cluster = SparkCluster(work_dir, free_port(), free_port())
    env = _env()
    try:
        master_log = work_dir / "master.log"
        cluster.procs.append((
            "spark master",
            spawn(
                [launcher, MASTER_CLASS, "--host", "127.0.0.1", "--port", str(cluster.master_port),
                 "--webui-port", str(cluster.master_ui_port)],
                master_log, env,
            ),
        ))  # fmt: skip
        for index in range(workers):
            worker_dir = work_dir / f"worker-{index}"
            worker_dir.mkdir(exist_ok=True)
            cluster.procs.append((
                f"spark worker {index}",
                spawn(
                    [launcher, WORKER_CLASS, cluster.url, "--host", "127.0.0.1", "--cores", str(cores),
                     "--memory", memory, "--work-dir", str(worker_dir), "--webui-port", str(free_port())],
                    work_dir / f"worker-{index}.log", env,
                ),
            ))  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while True:
            for name, proc in cluster.procs:
                if proc.poll() is not None:
                    raise DevStackError(f"{name} exited with {proc.returncode}:\n{tail(master_log)}")
            try:
                alive = [w for w in cluster.status().get("workers", []) if w.get("state") == "ALIVE"]
            except (OSError, ValueError):  # not listening yet, or its UI still starting (no JSON yet)
                alive = []
            if len(alive) >= workers:
                break
            if time.monotonic() > deadline:
                raise DevStackError(
                    f"the Spark cluster did not come up in {timeout_s:.0f} s ({len(alive)} of {workers} "
                    f"workers registered); logs in {work_dir}:\n{tail(master_log)}"
                )
            time.sleep(0.5)
    except BaseException:
        cluster.stop()
        raise
    say(
        f"Spark standalone cluster at {cluster.url}: {workers} worker(s) of {cores} cores and {memory} "
        f"(master UI {cluster.ui_url}, logs in {work_dir})"
    )
    return cluster
