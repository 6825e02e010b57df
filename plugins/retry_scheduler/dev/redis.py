"""Redis for the dev stack's CeleryExecutor: the one at the URL if it answers, else one started here.

``retry-scheduler dev up --executor celery`` needs a Celery broker. When nothing answers at
``RETRY_DEV_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) and the host is this machine, the
machine's ``redis-server`` (Debian's package) is started on that port, keeping nothing on disk.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

from retry_scheduler.dev.procs import LOCAL_HOSTS, DevStackError, Proc, Say, port_open, spawn, tail, terminate

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def redis_url() -> str:
    """The Celery broker of the dev stack: ``RETRY_DEV_REDIS_URL``, else Redis on this machine."""
    return os.environ.get("RETRY_DEV_REDIS_URL") or DEFAULT_URL


def ensure_redis(url: str, log_path: Path, say: Say = print, timeout_s: float = 20) -> Proc | None:
    """Make sure a Redis answers at ``url``; start ``redis-server`` there if none does.

    Returns the started process (the caller stops it with :func:`retry_scheduler.dev.procs.terminate`)
    or None when one was already answering.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise DevStackError(f"the Celery broker URL {url!r} must look like redis://HOST:PORT/DB")
    host, port = parts.hostname, parts.port or 6379
    if port_open(host, port):
        return None
    if host not in LOCAL_HOSTS:
        raise DevStackError(
            f"no Redis answers at {host}:{port}: start it, or point RETRY_DEV_REDIS_URL elsewhere"
        )
    server = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if server is None:
        raise DevStackError(
            "no Redis answers and redis-server is not installed: apt-get install redis-server"
        )
    # Nothing on disk: the broker's queues are rebuilt by the scheduler after a restart.
    proc = spawn(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--protected-mode", "yes"],
        log_path,
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while not port_open("127.0.0.1", port):
        if proc.poll() is not None or time.monotonic() > deadline:
            terminate(proc, "redis-server", timeout=5)
            raise DevStackError(f"redis-server did not start on port {port}:\n{tail(log_path)}")
        time.sleep(0.1)
    say(f"Redis started on 127.0.0.1:{port} (the Celery broker; log in {log_path})")
    return proc
