"""The wheel is the product: built, installed with Airflow into a fresh environment, used with no checkout.

Two module-scoped environments, one with the newest Airflow the extra resolves to and one with the
lowest it allows (3.1): the repository's files (tracked and new, as a fresh clone has them)
are copied out, built into a wheel, and the wheel is installed with its ``airflow`` extra into a new
virtual environment (``uv``, for speed; ``pip install`` does the same). Every command then runs from
a directory outside the checkout with an environment that names no path of it: the DAG files a user
copies (the thin ``dags/*.py``) are copied into a DAGs folder of its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.kafkautil import consume, create_topics, produce

pytestmark = [pytest.mark.install, pytest.mark.integration]

DAG_IDS = {
    "retry_scheduler",
    "retry_monitor",
    "dlq_replay",
    "dlq_window_replay",
    "retry_bulk_replay",
    "retry_compaction",
}


@dataclass
class Installed:
    wheel: Path
    #: "newest" or "lowest": which Airflow the environment has
    airflow: str
    bin: Path
    home: Path
    env: dict[str, str]

    def run(
        self, *args: str, timeout: float = 300, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), cwd=self.home, env={**self.env, **(env or {})}, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip


def _source_copy(dest: Path) -> Path:
    """The repository's files as a fresh clone has them (tracked, and new files not ignored)."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, names):
        source = ROOT / name
        if source.is_file() and not name.startswith("bench/out/"):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


#: The Airflow the extra resolves to (the newest), and the lowest the ``airflow`` extra allows.
AIRFLOW_VERSIONS = {"newest": None, "lowest": "apache-airflow==3.1.*"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from the repository's files as a fresh clone has them."""
    work = tmp_path_factory.mktemp("wheel")
    src = _source_copy(work / "src")
    dist = work / "dist"
    uv = Path(sys.executable).parent / "uv"
    subprocess.run(
        [str(uv), "build", "--quiet", "--wheel", "--out-dir", str(dist), str(src)], check=True, timeout=600
    )
    [built] = dist.glob("kafka_retry_scheduler-*.whl")
    return built


@pytest.fixture(scope="module", params=sorted(AIRFLOW_VERSIONS))
def installed(
    request: pytest.FixtureRequest, wheel: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    """The wheel and its ``airflow`` extra in a fresh virtual environment, with the newest or lowest Airflow."""
    work = tmp_path_factory.mktemp(f"installed-{request.param}")
    uv = Path(sys.executable).parent / "uv"
    venv = work / "venv"
    pin = AIRFLOW_VERSIONS[request.param]
    subprocess.run(
        [str(uv), "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, timeout=120
    )
    subprocess.run(
        [str(uv), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), f"{wheel}[airflow]",
         *([pin] if pin else [])],
        check=True, timeout=1200,
    )  # fmt: skip
    home = work / "elsewhere"
    dags = home / "dags"
    dags.mkdir(parents=True)
    for dag_file in (ROOT / "dags").glob("*.py"):
        shutil.copy2(dag_file, dags / dag_file.name)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "RETRY_", "KAFKA_", "PYTHON", "VIRTUAL_ENV"))
    }
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}/usr/bin:/bin",
        AIRFLOW_HOME=str(home / "airflow"),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
    )
    yield Installed(wheel, request.param, venv / "bin", home, env)


def test_wheel_holds_the_product_and_nothing_of_the_harness(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    for shipped in (
        "retry_scheduler/db/sql/queries.sql",
        "retry_scheduler/db/sql/migrations/0001_retry_jobs.sql",
        "retry_scheduler/spark/jobs/bulk_retry.py",
        "retry_scheduler/spark/jobs/compact.py",
        "retry_scheduler/core/default_policies.py",
        "retry_scheduler/airflow/webui/static/index.html",
        "retry_scheduler/airflow/plugin.py",
    ):
        assert shipped in names, shipped
    assert not [n for n in names if n.startswith(("bench/", "tests/")) or "chaos" in n or "bench.sql" in n]
    [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(installed.wheel).read(entry_points).decode()
    assert "[airflow.plugins]" in text and "retry_scheduler.airflow.plugin:RetrySchedulerPlugin" in text


def test_installed_cli_migrates_a_scratch_database(installed: Installed, bare_database_url: str) -> None:
    import psycopg

    version = installed.run(str(installed.bin / "retry-scheduler"), "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"retry-scheduler {project_version()}", (
        version
    )

    done = installed.run(
        str(installed.bin / "retry-scheduler"), "--database-url", bare_database_url, "db", "migrate"
    )
    assert done.returncode == 0, done.stderr
    shipped = sorted(p.stem for p in (ROOT / "sql" / "migrations").glob("*.sql"))  # every one, from the wheel
    assert done.stdout.startswith(f"applied {len(shipped)} migration(s): {', '.join(shipped)}"), done.stdout
    with psycopg.connect(bare_database_url) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM retry_schema_version ORDER BY 1")]
        assert versions == list(range(1, len(shipped) + 1))
        assert conn.execute("SELECT count(*) FROM retry_jobs_all").fetchone() == (0,)
    again = installed.run(
        str(installed.bin / "retry-scheduler"), "--database-url", bare_database_url, "db", "migrate"
    )
    assert (again.returncode, again.stdout.strip()) == (0, "schema is up to date")


def test_airflow_lists_the_plugin_and_parses_the_dag_files(installed: Installed) -> None:
    plugins = installed.run(str(installed.bin / "airflow"), "plugins", "--output", "json")
    assert plugins.returncode == 0, plugins.stderr[-2000:]
    listed = json.loads(plugins.stdout[plugins.stdout.index("[") :])
    [plugin] = [p for p in listed if p["name"] == "retry_scheduler"]
    assert "retry_scheduler.airflow.plugin" in json.dumps(plugin)

    script = (
        "import json\n"
        "try:\n    from airflow.dag_processing.dagbag import DagBag\n"
        "except ImportError:\n    from airflow.models.dagbag import DagBag\n"
        "bag = DagBag()\n"
        "import airflow\n"
        "print(json.dumps({'errors': {k: str(v) for k, v in bag.import_errors.items()},"
        " 'dags': {d: bag.dags[d].fileloc for d in bag.dags}, 'version': airflow.__version__}))\n"
    )
    parsed = installed.run(str(installed.bin / "python"), "-c", script)
    assert parsed.returncode == 0, parsed.stderr[-2000:]
    bag = json.loads(parsed.stdout.strip().splitlines()[-1])
    assert bag["version"].startswith("3.1.") == (installed.airflow == "lowest"), bag["version"]
    assert bag["errors"] == {}
    assert set(bag["dags"]) == DAG_IDS
    dags_folder = installed.env["AIRFLOW__CORE__DAGS_FOLDER"]
    assert all(Path(f).parent == Path(dags_folder) for f in bag["dags"].values()), bag["dags"]


def test_installed_loops_ingest_and_publish(
    installed: Installed, database_url: str, bootstrap_servers: str, topic_prefix: str
) -> None:
    destination, retry_topic = f"{topic_prefix}.orders", f"{topic_prefix}.retries"
    due = int(time.time() * 1000)
    records = [
        {
            "key": f"k{i}".encode(),
            "value": f"order {i}".encode(),
            "headers": [
                ("retry.destination", destination.encode()),
                ("retry.at", str(due).encode()),
                ("trace", bytes([i, 0, 255])),
            ],
        }
        for i in range(5)
    ]
    create_topics(bootstrap_servers, [retry_topic, destination])
    produce(bootstrap_servers, retry_topic, records)
    ran = installed.run(
        str(installed.bin / "retry-scheduler"),
        "--database-url", database_url, "--kafka-bootstrap", bootstrap_servers,
        "run", "--seconds", "8", "--grace", "0",
        env={"RETRY_TOPIC": retry_topic, "RETRY_CONSUMER_GROUP": f"{topic_prefix}-g", "RETRY_CREATE_TOPICS": "true",
             # Destinations are denied by default: this deployment allows its one.
             "RETRY_DESTINATION_ALLOWLIST": re.escape(destination)},
        timeout=180,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    seen = consume(bootstrap_servers, [destination], expected=5, timeout_s=30)
    assert sorted(s.value for s in seen) == [f"order {i}".encode() for i in range(5)]
    for s in seen:
        i = int(s.value.decode().split()[1])
        assert s.key == f"k{i}".encode()
        assert s.header("retry.attempt") == "1"
        assert [v for n, v in s.headers if n == "trace"] == [bytes([i, 0, 255])]


def test_migrate_fails_loudly_when_the_installation_lacks_its_migrations(
    installed: Installed, bare_database_url: str
) -> None:
    [migrations] = (installed.bin.parent / "lib").glob(
        "python3*/site-packages/retry_scheduler/db/sql/migrations"
    )
    aside = migrations.with_name("migrations-aside")
    migrations.rename(aside)
    try:
        done = installed.run(
            str(installed.bin / "retry-scheduler"), "--database-url", bare_database_url, "db", "migrate"
        )
    finally:
        aside.rename(migrations)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("retry-scheduler: no migrations found"), done.stderr
    assert "reinstall" in lines[0]


def project_version() -> str:
    """The version ``pyproject.toml`` gives the wheel."""
    import tomllib

    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])
