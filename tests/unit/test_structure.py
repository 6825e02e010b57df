"""The package's and the harness's shape: no module over 500 lines, no import cycle between modules.

Issue 31's size rule: a module that outgrows 500 lines is two modules (split along the seam its own
notes name). An import cycle is two modules that cannot be understood, or loaded, one without the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"retry_scheduler": ROOT / "plugins" / "retry_scheduler", "bench": ROOT / "bench"}
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    found = {}
    for name, base in PACKAGES.items():
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((name, *parts))] = path
    return found


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` imports when it is loaded (imports inside functions and
    under TYPE_CHECKING are not cycles: they run later, or never)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def add(name: str) -> None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    add(full if full in known else base)
            elif isinstance(node, ast.If):
                test = ast.unparse(node.test)
                if "TYPE_CHECKING" not in test:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return found


def test_no_module_is_over_500_lines() -> None:
    long = {
        name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"modules over {MAX_LINES} lines (split each along its own seam): {long}"


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    # The reader sees imports (a check that it does, so that an empty graph cannot pass):
    assert "retry_scheduler.db.store" in graph["retry_scheduler.loops.ingest"]
    assert "retry_scheduler.core.protocol" in graph["retry_scheduler.core.adopt"]
    # A package imports its own submodules (``from . import x``) and they import names from it: that
    # is how a package is loaded, not a cycle of two modules.
    graph = {
        name: {dep for dep in deps if not (dep.startswith(name + ".") or name.startswith(dep + "."))}
        for name, deps in graph.items()
    }
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                walk(dep)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name)
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def _every_import(path: Path) -> set[str]:
    """Every module name ``path`` imports, at any depth (inside functions and TYPE_CHECKING too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


def test_only_the_airflow_rooms_import_airflow_s_side_of_the_package() -> None:
    """The floors point one way: the loops, the operations, the Spark jobs and the command line
    never import ``retry_scheduler.airflow`` (the loop runners are ``loops.runners``; the monitor
    sends to any ``ops.alerts.Channel``), so the command line works, and is read, without it."""
    upward = {
        name: sorted(i for i in _every_import(path) if i.startswith("retry_scheduler.airflow"))
        for name, path in _modules().items()
        if name.startswith("retry_scheduler.") and not name.startswith("retry_scheduler.airflow")
    }
    upward = {name: found for name, found in upward.items() if found}
    assert upward == {}, f"modules below the Airflow rooms that import them: {upward}"
    # The reader sees imports inside functions (so that an empty result cannot pass unseen):
    assert "retry_scheduler.loops.runners" in _every_import(
        PACKAGES["retry_scheduler"] / "airflow" / "tasks.py"
    )


#: The database driver, and the named statements: the data-access layer's own (issue 61).
DATABASE_MODULES = ("psycopg", "psycopg_pool", "retry_scheduler.db.schema")


def test_the_operations_run_no_sql_of_their_own() -> None:
    """Every statement of the dead-letter operations, the monitor and the alerts is a method of a
    port under ``db/`` (the dead letters' is ``db.dead_letters``): ``ops/`` imports neither the
    driver nor the named statements, and executes nothing."""
    ops = PACKAGES["retry_scheduler"] / "ops"
    offending = {
        path.name: sorted(m for m in _every_import(path) if m.startswith(DATABASE_MODULES))
        for path in sorted(ops.glob("*.py"))
    }
    offending = {name: found for name, found in offending.items() if found}
    assert offending == {}, f"ops/ modules that reach the database themselves: {offending}"
    executes = sorted(p.name for p in ops.glob("*.py") if ".execute(" in p.read_text())
    assert executes == [], f"ops/ modules that execute statements: {executes}"
    # The reader sees what it looks for (so that an empty result cannot pass unseen):
    port = PACKAGES["retry_scheduler"] / "db" / "dead_letters.py"
    assert {"psycopg", "retry_scheduler.db.schema"} <= _every_import(port)


#: Where a request comes in, and so where a deployment (settings and policies) is read: the command
#: line, the Airflow side (the hook for tasks, the page, the notifiers, the DAG factories), the dev
#: tooling, and a Spark job's command line and connection file.
FRONT_DOORS = (
    "retry_scheduler.cli", "retry_scheduler.airflow", "retry_scheduler.dev",
    "retry_scheduler.spark.connection_file", "retry_scheduler.spark.bulk_options",
    # where the readers are defined
    "retry_scheduler.core.deployment", "retry_scheduler.core.config", "retry_scheduler.core.policy",
)  # fmt: skip
#: Process knobs read from the environment below the front doors, each by the one module it is about
#: (documented in docs/configuration.md): they are how a process runs, not the deployment's settings.
PROCESS_KNOBS = {
    "retry_scheduler.spark.jdbc": "RETRY_SPARK_JARS / RETRY_SPARK_PACKAGES: spark-submit's classpath",
    "retry_scheduler.spark.class_archive": "JAVA_HOME, RETRY_SPARK_CLASS_ARCHIVE: the driver's JVM",
    "retry_scheduler.spark.submit": "RETRY_SPARK_MASTER, RETRY_ARCHIVE_URI; the child's environment",
    "retry_scheduler.spark.executor_env": "the executors' Python and archive, the local niceness",
    "retry_scheduler.db.connection": "RETRY_STATEMENT_TIMEOUT_MS: every session's statement timeout",
    "retry_scheduler.core.faults": "RETRY_FAULTS: the chaos harness's fault plan",
    "retry_scheduler.loops.ingest_worker": "the worker processes inherit the loop's environment",
}


def _reads(path: Path) -> set[str]:
    """What ``path`` reads a deployment or the environment with: ``load_policies``, ``from_env``,
    ``Deployment.load``, ``os.environ`` / ``os.getenv``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if func.endswith(("load_policies", "from_env", "Deployment.load")) or func == "os.getenv":
                found.add(func)
        elif isinstance(node, ast.Attribute) and ast.unparse(node) == "os.environ":
            found.add("os.environ")
    return found


def test_only_the_front_doors_read_the_deployment() -> None:
    """One Deployment, built where a request comes in and passed down: the loops, the row builder,
    the dead-letter operations and the Spark jobs' bodies read neither the policies module nor the
    environment for settings (issue 31)."""
    below = {
        name: sorted(found)
        for name, path in _modules().items()
        if name.startswith("retry_scheduler.")
        and not any(name == door or name.startswith(door + ".") for door in FRONT_DOORS)
        and (found := _reads(path) - ({"os.environ", "os.getenv"} if name in PROCESS_KNOBS else set()))
    }
    assert below == {}, f"modules below the front doors that read the deployment themselves: {below}"
    # The reader sees what it looks for (so that an empty result cannot pass unseen):
    assert _reads(PACKAGES["retry_scheduler"] / "cli" / "main.py") >= {"Settings.from_env"}
    assert "Deployment.load" in _reads(PACKAGES["retry_scheduler"] / "airflow" / "tasks.py")


#: Issue 61's rule: no product function over 80 lines (a long one is split into its steps).
MAX_FUNCTION_LINES = 80


def test_no_product_function_is_over_80_lines() -> None:
    base = PACKAGES["retry_scheduler"]
    found, read = {}, 0
    for path in sorted(base.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                read += 1
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found[f"{path.relative_to(base)}:{node.name}"] = lines
    assert read > 500, f"the reader found only {read} functions in the package"
    assert found == {}, f"functions over {MAX_FUNCTION_LINES} lines (split each into its steps): {found}"


def test_lateness_is_defined_once() -> None:
    """Publish lateness is the SQL function ``retry_lateness_s`` (migration 0026): no statement of the
    product, the demo or the benchmark writes its own ``published_at - due_at`` (issue 61)."""
    definition = ROOT / "sql" / "migrations" / "0026_lateness.sql"
    files = [
        *(ROOT / "sql").rglob("*.sql"),
        *(ROOT / "bench").rglob("*.sql"),
        *(ROOT / "bench").rglob("*.py"),
    ]
    files += PACKAGES["retry_scheduler"].rglob("*.py")
    own = sorted(
        str(p.relative_to(ROOT))
        for p in files
        if p != definition and "published_at - due_at" in p.read_text()
    )
    assert own == [], f"lateness written out again (use retry_lateness_s(published_at, due_at)): {own}"
    assert "published_at - due_at" in definition.read_text()
    # The readers call it (so that an empty result cannot pass unseen):
    assert "retry_lateness_s(" in (ROOT / "sql" / "queries.sql").read_text()
    assert "retry_lateness_s(" in (ROOT / "bench" / "bench.sql").read_text()


#: What a front door may take from ``db/``: errors and connections (the page's pool), a selection's
#: argument parsing, and the migrations (``db migrate``); never the store or its parts (issue 61).
FRONT_DOOR_DB = {"retry_scheduler.db.connection", "retry_scheduler.db.selection", "retry_scheduler.db.schema"}


def test_the_front_doors_reach_the_store_only_through_operations() -> None:
    """The command line and the Airflow side (tasks, forms, the page) parse a request and call an
    operation (``ops/``, ``loops.runners``); none of them opens the store or one of its parts."""
    base = PACKAGES["retry_scheduler"]
    doors = [*(base / "cli").rglob("*.py"), *(base / "airflow").rglob("*.py")]
    found = {
        str(path.relative_to(base)): sorted(used)
        for path in doors
        if (
            used := {
                m for m in _every_import(path) if m.startswith("retry_scheduler.db.") and m.count(".") == 2
            }
            - FRONT_DOOR_DB
        )
    }
    assert found == {}, f"front doors that open the store themselves: {found}"
    # The reader sees what it looks for (so that an empty result cannot pass unseen):
    assert "retry_scheduler.db.connection" in _every_import(base / "cli" / "main.py")


#: What composes or names a statement: only ``db/`` does (and ``dev/``, the dev stack's own server
#: administration: its databases, roles and Airflow's metadata templates, not the service's data).
STATEMENT_MAKERS = {
    "psycopg.sql", "psycopg.types.json", "psycopg.types.json.Jsonb",
    "retry_scheduler.db.schema.q", "retry_scheduler.db.schema.queries",
}  # fmt: skip


def test_every_statement_of_the_service_is_under_db() -> None:
    """Issue 61: every SQL statement of the service lives under ``db/``, in modules named by who
    uses them; the loops, the operations, the Spark jobs and the front doors call their methods."""
    base = PACKAGES["retry_scheduler"]
    outside = [p for p in base.rglob("*.py") if p.relative_to(base).parts[0] not in ("db", "dev")]
    found = {
        str(path.relative_to(base)): sorted(used)
        for path in outside
        if (used := _every_import(path) & STATEMENT_MAKERS)
    }
    assert found == {}, f"statements made outside db/: {found}"
    # The reader sees what it looks for (so that an empty result cannot pass unseen):
    assert "psycopg.sql" in _every_import(base / "db" / "dead_letters.py")
    assert "retry_scheduler.db.schema.q" in _every_import(base / "db" / "compaction.py")


def _connection_opens(path: Path) -> list[str]:
    """The calls in ``path`` that open a database connection or pool (``owner.name:line``; a bare
    ``connect:line`` is allowed where ``db.connection.connect`` is what the module imported)."""
    opens = {"connect", "ConnectionPool", "AsyncConnectionPool"}
    bare_is_ours = "retry_scheduler.db.connection.connect" in _every_import(path)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = (
                func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            )
            ours = owner == "" and name == "connect" and bare_is_ours
            if (
                name in opens
                and owner in ("", "psycopg", "psycopg_pool", "Connection", "AsyncConnection")
                and not ours
            ):
                found.append(f"{owner + '.' if owner else ''}{name}:{node.lineno}")
    return found


def test_database_connections_are_opened_under_db() -> None:
    """Issue 61: the service's connections and pools are opened by ``db/`` (``db.connection.connect``,
    ``open_pool``, the store), which set the statement timeout and say what is wrong when the database
    cannot be used; elsewhere a module asks ``db/`` for one. ``dev/`` administers the dev servers."""
    base = PACKAGES["retry_scheduler"]
    outside = [p for p in base.rglob("*.py") if p.relative_to(base).parts[0] not in ("db", "dev")]
    found = {str(p.relative_to(base)): opens for p in outside if (opens := _connection_opens(p))}
    assert found == {}, f"connections opened outside db/: {found}"
    # The reader sees what it looks for:
    assert any(o.startswith("psycopg.connect:") for o in _connection_opens(base / "db" / "connection.py"))
