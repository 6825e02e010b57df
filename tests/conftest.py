"""Shared fixtures: a real PostgreSQL database per test and a real Apache Kafka 4.4 broker.

PostgreSQL: ``RETRY_TEST_DATABASE_URL`` (default: the local server) must answer; each test gets a
fresh database copied from a migrated template. Kafka: a broker of the dev tooling started once per
session (per test worker) on a free port; tests isolate themselves with unique topic names.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import resource
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from retry_scheduler.dev.postgres import DEV_MARK, dev_mark, mark_database
from retry_scheduler.dev.procs import free_port

ROOT = Path(__file__).resolve().parents[1]
ADMIN_URL = os.environ.get("RETRY_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
#: One template per test session (its pid in the name), so that two ``make test`` runs on one machine
#: (two checkouts, or a CI clone beside a working copy) do not drop each other's template.
TEMPLATE_PREFIX = "retry_test_template_"
TEMPLATE_DB = f"{TEMPLATE_PREFIX}{os.getpid()}"
#: The tests' deployment allows their own topics (``topic_prefix``) as destinations, and nothing
#: else: destinations are denied by default. Set for every process the tests start.
TEST_DESTINATIONS = r"t[0-9a-f]{8}[.-][A-Za-z0-9._-]+"
os.environ["RETRY_DESTINATION_ALLOWLIST"] = TEST_DESTINATIONS
#: Every JVM the tests start (Spark drivers, sessions, a cluster's master, worker and executors)
#: compiles with C1 only: their jobs last seconds, and C2's compiler threads spent half of their CPU
#: (the class-archive warm-up job: 32.6 CPU seconds, 17.0 with C1 only). The JVM says "Picked up
#: JAVA_TOOL_OPTIONS" on stderr. Set JAVA_TOOL_OPTIONS (even empty) to choose otherwise.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")
#: The pytest-xdist worker this process is (``gw0``, ``gw1``...); empty when the tests run in one process.
#: What a worker keeps between runs (Airflow's home and metadata database) carries it in its name.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


@pytest.hookimpl(trylast=True)  # after -m and -k deselected what does not run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, start the longest tests first, spread over the workers.

    Work stealing first hands each of the N workers a contiguous share of the collection (about
    len/N tests), then an idle worker takes the second half of the longest queue. The end-to-end,
    cluster and ``long`` tests (a dev stack, a cluster or chaos trials: minutes each) would otherwise sit
    in the middle of one share and start late, and the last of them would end the run alone. They are
    dealt round the shares' heads, a module's together (its tests may share a stack); the rest keep
    their order. Every worker computes the same order.
    (In ``make test-random`` this runs after the shuffle: the heads still go first, shuffled.)
    """
    workers = int(getattr(config, "workerinput", {}).get("workercount", 0))
    if workers < 2:
        return
    heads = [
        i
        for i in items
        if i.nodeid.startswith("tests/e2e/")
        or i.get_closest_marker("cluster")
        or i.get_closest_marker("long")
    ]
    if not heads:
        return
    first = set(heads)
    rest = [i for i in items if i not in first]
    modules: dict[str, list[pytest.Item]] = {}
    for item in heads:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for n, module in enumerate(modules.values()):
        shares[n % workers] += module
    ordered: list[pytest.Item] = []
    for n in range(workers):  # as xdist sizes them: what is left divided by the workers left
        size = (len(items) - len(ordered)) // (workers - n)
        take = max(0, size - len(shares[n]))
        ordered += shares[n] + rest[:take]
        rest = rest[take:]
    items[:] = ordered + rest


def pytest_unconfigure(config: pytest.Config) -> None:
    """Keep what is logged at interpreter exit, after the summary, out of the output unless it warns.

    Importing Airflow configures logging while pytest captures output: the root logger gets a handler
    (INFO) on pytest's capture file. At interpreter exit py4j's garbage-collection thread may log
    through the root logger (``logging.info`` with a traceback, when the stopped JVM resets its
    connection). A handler on the closed capture file would print "--- Logging error ---"; with no
    handler at all, ``logging.info`` would call ``basicConfig`` and print the INFO message and its
    traceback to stderr. So the capture handlers go, and the real stderr gets warnings and errors only.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        stream = getattr(handler, "stream", None)
        if isinstance(handler, logging.StreamHandler) and stream not in (sys.__stderr__, sys.__stdout__):
            root.removeHandler(handler)
    if not root.handlers:
        warnings_only = logging.StreamHandler(sys.__stderr__)
        warnings_only.setLevel(logging.WARNING)
        root.addHandler(warnings_only)


#: Each test's setup, call and teardown seconds (``report.when``), for the phases report.
_PHASES: dict[str, dict[str, float]] = {}


#: This process's CPU seconds (its own and its ended children's) when the running test's last phase ended.
_cpu_mark = 0.0


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> None:
    global _cpu_mark
    _cpu_mark = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Each phase's report carries the CPU seconds it used in the process that ran it (``cpu_s``):
    the test's own and that of the processes it started and waited for (a stack's, at its teardown).
    A process still running when the phase ends (a session's broker or Spark JVM) counts later, in the
    phase that waits for it, and one an earlier test abandoned counts when ``subprocess`` reaps it
    (at its next start of a process): a ranking of where the CPU went, not an exact bill."""
    global _cpu_mark
    outcome = yield
    now = _cpu_seconds()
    outcome.get_result().user_properties.append(("cpu_s", round(now - _cpu_mark, 2)))
    _cpu_mark = now


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Note how long each phase of each test took and the CPU it used (in the pytest-xdist controller
    too: the workers' reports arrive there), for ``_write_phases``."""
    phases = _PHASES.setdefault(report.nodeid, {})
    phases[report.when] = round(report.duration, 3)
    cpu = dict(report.user_properties).get("cpu_s")
    if isinstance(cpu, (int, float)):
        phases["cpu"] = round(phases.get("cpu", 0.0) + cpu, 2)


def _write_phases(config: pytest.Config) -> None:
    """Beside the JUnit report (``--junitxml=X.xml``), ``X.phases.json``: each test's setup, call and
    teardown seconds and the CPU seconds of all three (``cpu``). JUnit gives one figure per test; the
    fixtures' share (stack start-ups, Spark sessions) is in the setups and teardowns.
    ``.ci/slowest.py`` sums them by directory."""
    xmlpath = getattr(config.option, "xmlpath", None)
    if not xmlpath or hasattr(config, "workerinput") or not _PHASES:
        return
    target = Path(xmlpath).with_suffix(".phases.json")
    with contextlib.suppress(OSError):
        target.write_text(json.dumps(_PHASES, indent=0, sort_keys=True))


def _db_url(name: str) -> str:
    base, _, _ = ADMIN_URL.rpartition("/")
    return f"{base}/{name}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _max_connections(conn: Any) -> int:
    """The server's ``max_connections``, on an open connection to it."""
    row = conn.execute("SELECT current_setting('max_connections')::int").fetchone()
    return int(row[0]) if row else 100


@pytest.fixture(scope="session", autouse=True)
def stack_slots() -> Iterator[int]:
    """Under pytest-xdist, every dev stack a test starts (in a fixture, a test or the benchmark's code)
    first takes one of the machine's stack slots (:mod:`tests.stack_slots`), so that the stacks running
    at once never hold more connections than PostgreSQL's ``max_connections`` allows; yields how many
    slots there are (0: one process, no limit needed)."""
    if not WORKER:
        yield 0
        return
    import psycopg

    from retry_scheduler.dev.stack import DevStack
    from tests import stack_slots as slots

    with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=10) as conn:
        count = slots.slot_count(_max_connections(conn), os.environ.get("RETRY_TEST_STACK_SLOTS"))
    start, stop = DevStack.start, DevStack.stop

    def start_in_slot(stack: Any) -> None:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
        began = time.monotonic()
        stack._test_slot = slots.acquire(count, f"{WORKER} {test}")
        waited = time.monotonic() - began
        if waited > 1:
            logging.getLogger(__name__).warning(
                "%s waited %.0f s for one of %s dev stack slots", test, waited, count
            )
        start(stack)  # a failed start stops the stack, which frees the slot

    def stop_and_free(stack: Any) -> None:
        try:
            stop(stack)
        finally:
            slots.release(getattr(stack, "_test_slot", None))
            stack._test_slot = None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DevStack, "start", start_in_slot)
        patch.setattr(DevStack, "stop", stop_and_free)
        yield count


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A migrated database that each test's database is copied from; dropped when the session ends.

    Templates left by sessions that were killed (their pid no longer running) are dropped first.
    """
    import psycopg

    from retry_scheduler.db.schema import migrate

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", (TEMPLATE_PREFIX,)
            )
        ]
        for name in names:
            suffix = name.removeprefix(TEMPLATE_PREFIX)
            if name == TEMPLATE_DB or not suffix.isdigit() or not _pid_alive(int(suffix)):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{TEMPLATE_DB}"')
    migrate(_db_url(TEMPLATE_DB))
    yield TEMPLATE_DB
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)')


def checkout_db_name(prefix: str) -> str:
    """The name of this checkout's ``prefix`` database: ``prefix``, a hash of the checkout's path and,
    in a pytest-xdist worker, the worker's name (two workers never share one)."""
    return f"{prefix}{hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]}" + (f"_{WORKER}" if WORKER else "")


def checkout_database(prefix: str) -> str:
    """Create this checkout's ``prefix`` database when missing (kept between test runs); its name.

    Its comment names the checkout (after the dev tooling's mark, so that the dev stacks of the tests
    may use it: ``retry_scheduler.dev.postgres.claim_database``); other ``prefix`` databases whose
    checkout is gone (CI clones) are dropped. Two checkouts on one machine (a CI clone beside a working copy) then never share it,
    while each keeps its own between runs (migrating Airflow's takes a minute).
    """
    import psycopg
    from psycopg import sql

    name = checkout_db_name(prefix)
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        owners = conn.execute(
            "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database "
            "WHERE starts_with(datname, %s)",
            (prefix,),
        ).fetchall()
        for other, comment in owners:
            checkout = (comment or "").removeprefix(DEV_MARK).strip()
            if other != name and checkout and not Path(checkout).is_dir():
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(other)))
        if name not in {other for other, _ in owners}:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            mark_database(conn, name, dev_mark(ROOT))
        elif dict(owners)[name] != dev_mark(ROOT):  # commented by an older checkout_database: the path only
            mark_database(conn, name, dev_mark(ROOT))
    return name


@contextlib.contextmanager
def _scratch_database(name: str, template: str | None = None, encoding: str | None = None) -> Iterator[str]:
    """Create database ``name`` (a copy of ``template``, or empty; in ``encoding``, from template0, when
    given), yield its URL, then drop it."""
    import psycopg

    copy = f' TEMPLATE "{template}"' if template else ""
    if encoding:
        copy = f" TEMPLATE template0 ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C'"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{copy}')
    try:
        yield _db_url(name)
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(pg_template: str) -> Iterator[str]:
    """A fresh, migrated database for one test, dropped afterwards."""
    with _scratch_database(f"retry_test_{uuid.uuid4().hex[:10]}", template=pg_template) as url:
        yield url


@pytest.fixture(scope="module")
def module_database_url(pg_template: str) -> Iterator[str]:
    """A fresh, migrated database for the tests of one module (say, around a dev stack they share),
    dropped after them: each test empties what it uses (:func:`empty_service_tables`)."""
    with _scratch_database(f"retry_test_{uuid.uuid4().hex[:10]}", template=pg_template) as url:
        yield url


def empty_service_tables(database_url: str) -> None:
    """Remove every row of the service's tables (the schema's version stays)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public' "
                "AND tablename <> 'retry_schema_version'"
            )
        ]
        if tables:
            conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")


@pytest.fixture
def bare_database_url() -> Iterator[str]:
    """A new database on the test server that was never migrated, as a first-time user has it."""
    with _scratch_database(f"retry_test_bare_{uuid.uuid4().hex[:8]}") as url:
        yield url


@pytest.fixture
def latin1_database_url() -> Iterator[str]:
    """A migrated database whose server encoding is LATIN1: its text refuses most of Unicode."""
    from retry_scheduler.db.schema import migrate

    with _scratch_database(f"retry_test_latin1_{uuid.uuid4().hex[:8]}", encoding="LATIN1") as url:
        migrate(url)
        yield url


@pytest.fixture(scope="session")
def bootstrap_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An Apache Kafka 4.4 broker (KRaft, one node) for the session, one per test worker.

    One per worker rather than one shared by all: tests that freeze or stop a broker have their own
    anyway, and a worker's broker costs about 5 s to start, 350 MB and 3 % of a core at rest (measured
    here); tests isolate themselves with unique topic names and group ids (``topic_prefix``).
    ``RETRY_TEST_BOOTSTRAP`` names a broker to use instead (a user's own cluster).
    """
    from retry_scheduler.dev.broker import start_broker
    from retry_scheduler.dev.procs import terminate

    if given := os.environ.get("RETRY_TEST_BOOTSTRAP"):
        yield given
        return
    port = free_port()
    home = tmp_path_factory.mktemp("broker")
    proc = start_broker(port, "127.0.0.1", home / "kafka.log", say=lambda _m: None, home=home / "kafka")
    assert proc is not None, f"port {port} answered as a Kafka broker before ours started"
    try:
        yield f"127.0.0.1:{port}"
    finally:
        terminate(proc, "broker", timeout=30)


@pytest.fixture
def topic_prefix() -> str:
    """A unique prefix so tests sharing the broker never see each other's records."""
    return f"t{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Spark standalone cluster for the session: a master and one worker of 2 cores, JVMs of their own."""
    from retry_scheduler.dev.spark_cluster import start_cluster

    with start_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=1, cores=2, memory="2g") as cluster:
        yield cluster


#: The Python a cluster's executors run in the tests: the interpreter this virtual environment was
#: made from, which has none of the jobs' packages (they must come from the submission's archive).
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)


def _descendants(pid: int) -> list[tuple[int, str]]:
    """The processes below ``pid`` (pid, command line), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent:
                frontier.append(child)
                try:
                    command = (Path("/proc") / str(child) / "cmdline").read_bytes().replace(b"\0", b" ")
                except OSError:
                    command = b"?"
                found.append((child, command.decode(errors="replace").strip()[:200]))
    return found


class _ConnectionPeak:
    """The most client connections PostgreSQL had while the tests ran (sampled every 2 s by the
    pytest-xdist controller, with one connection of its own), for the run's summary."""

    def __init__(self) -> None:
        import threading

        self.peak, self.limit = 0, 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._sample, name="pg-connection-peak", daemon=True)

    def _sample(self) -> None:
        import psycopg

        try:
            with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=10) as conn:
                self.limit = _max_connections(conn)
                while not self.stopped.wait(2.0):
                    row = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                    ).fetchone()
                    self.peak = max(self.peak, int(row[0]) if row else 0)
        except psycopg.Error:
            return


_PEAK: _ConnectionPeak | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _PEAK
    if not hasattr(session.config, "workerinput") and getattr(session.config.option, "numprocesses", None):
        _PEAK = _ConnectionPeak()
        _PEAK.thread.start()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _PEAK is None:
        return
    _PEAK.stopped.set()
    if _PEAK.limit:
        terminalreporter.write_line(
            f"PostgreSQL: at most {_PEAK.peak} client connections at once (max_connections {_PEAK.limit})"
        )


#: What the pytest-xdist workers reported left running (the controller fails the run with it).
_WORKERS_LEFT: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """In the pytest-xdist controller: a worker's leftover processes (a worker's exit status is not its
    own verdict in pytest-xdist, so it hands the listing over in its output)."""
    left = getattr(node, "workeroutput", {}).get("left_processes")
    if left:
        _WORKERS_LEFT.append(f"{node.gateway.id}:\n{left}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The suite leaves no process behind: what a test started and did not stop (a broker, a stack, a JVM)
    is listed and stopped here, after every fixture's teardown, and fails the run
    (``RETRY_TEST_STRICT_PROCESSES=0`` only lists it). In pytest-xdist each worker checks its own and the
    controller (whose children are the workers) fails the run with what they report."""
    _write_phases(session.config)
    strict = os.environ.get("RETRY_TEST_STRICT_PROCESSES", "1") != "0"
    worker = hasattr(session.config, "workerinput")
    if not worker and getattr(session.config.option, "numprocesses", None):
        if _WORKERS_LEFT:
            _fail_with_leftovers(session, "\n".join(_WORKERS_LEFT), strict)
        return
    # what is already stopping gets the time to exit
    deadline = time.monotonic() + float(os.environ.get("RETRY_TEST_PROCESS_GRACE_S", "10"))
    left = _descendants(os.getpid())
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _descendants(os.getpid())
    if not left:
        return
    for pid, _command in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    listing = "\n".join(f"  {pid}: {command}" for pid, command in left)
    if worker:
        session.config.workeroutput["left_processes"] = listing  # type: ignore[attr-defined]
        return
    _fail_with_leftovers(session, listing, strict)


def _fail_with_leftovers(session: pytest.Session, listing: str, strict: bool) -> None:
    sys.__stderr__.write(f"\nprocesses the tests left running (stopped now):\n{listing}\n")
    if strict and session.exitstatus == 0:
        session.exitstatus = 1
