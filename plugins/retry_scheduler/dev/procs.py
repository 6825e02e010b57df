"""Child processes of the dev tooling: spawning in their own sessions, stopping, log tails, ports."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Say = Callable[[str], None]
log = logging.getLogger(__name__)

Proc = subprocess.Popen[bytes]
LOCAL_HOSTS = {"", "localhost", "127.0.0.1", "::1"}


class DevStackError(RuntimeError):
    """A dev-stack component could not start or died; the message says what to do."""


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


#: Where :func:`free_port` looks first: below the kernel's ephemeral range, whose ports any outgoing
#: connection may take between the moment a port is found free and the moment a server binds it.
PRIVATE_PORTS = range(20000, 32768)


def _ephemeral_range() -> range:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a private broker, server or API).

    Chosen at random outside the kernel's ephemeral range when it can be: a port from that range,
    found free, could be taken by a client's outgoing connection before the server that was to listen
    on it (a Kafka node restarted on its old ports, a broker started seconds later) binds it.
    """
    ephemeral = _ephemeral_range()
    candidates = [p for p in random.sample(PRIVATE_PORTS, 64) if p not in ephemeral]
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def spawn(cmd: list[str], log_path: Path, env: dict[str, str] | None = None, **kwargs: Any) -> Proc:
    """Start ``cmd`` in a new session (its own process group), output appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        kwargs.update(stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)
        return subprocess.Popen(cmd, start_new_session=True, **kwargs)


def _live_groups() -> set[int]:
    """The process groups with a live (non-zombie) process left; a container's init may never reap."""
    groups: set[int] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            state, _ppid, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
            if state != "Z":
                groups.add(int(pgrp))
    return groups


def terminate(
    proc: Proc, name: str, timeout: float = 20.0, while_waiting: Callable[[], object] = lambda: None
) -> None:
    """SIGTERM the child's whole process group, then SIGKILL whatever is left after ``timeout``;
    ``while_waiting`` is called every 0.2 s while the group has not ended after SIGTERM."""
    terminate_all([(name, proc, timeout)], while_waiting)


#: A service whose main process is still running this long after SIGTERM is sent it once more: a
#: signal that arrives while Python runs a garbage collector's callback is lost (Airflow's scheduler
#: handles SIGTERM with ``sys.exit``, and the SystemExit raised there is "ignored"), and the service
#: would then run on until SIGKILL.
RESIGNAL_S = 15.0


def terminate_all(
    procs: list[tuple[str, Proc, float]],
    while_waiting: Callable[[], object] = lambda: None,
    resignal_s: float = RESIGNAL_S,
) -> None:
    """:func:`terminate` for several children at once, each ``(name, child, timeout)``: all are sent
    SIGTERM together and waited for together (each stops in its own time, not after the others).
    A main process still running ``resignal_s`` after SIGTERM is sent it again, once."""
    waiting: list[tuple[str, Proc, float, signal.Signals, float]] = []
    began, resent = time.monotonic(), set()
    for name, proc, timeout in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        waiting.append((name, proc, timeout, signal.SIGTERM, time.monotonic() + timeout))
    while waiting:
        live, still = _live_groups(), []
        for name, proc, timeout, sig, deadline in waiting:
            if proc.poll() is not None and proc.pid not in live:
                continue
            if time.monotonic() < deadline:
                if (
                    sig is signal.SIGTERM
                    and proc.pid not in resent
                    and proc.poll() is None
                    and time.monotonic() - began >= resignal_s
                ):
                    log.info("%s still running %.0f s after SIGTERM: sending it again", name, resignal_s)
                    resent.add(proc.pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGTERM)
                still.append((name, proc, timeout, sig, deadline))
            elif sig is signal.SIGTERM:
                # A scheduler or a Celery worker waits for the tasks it runs; DevStack asks those to
                # end first. Killing is safe anyway: the loops are at-least-once, the next run resumes.
                log.info("%s still running %.0f s after SIGTERM: sending SIGKILL", name, timeout)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                still.append((name, proc, timeout, signal.SIGKILL, time.monotonic() + timeout))
            else:
                log.warning("%s still running %.0f s after SIGKILL", name, timeout)
        waiting = still
        if any(sig is signal.SIGTERM for *_rest, sig, _deadline in waiting):
            while_waiting()
        if waiting:
            time.sleep(0.2)


def kafka_answers(bootstrap: str, timeout: float) -> bool:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=timeout)
        return True
    except KafkaException:
        return False
