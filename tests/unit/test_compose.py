"""Static checks of docker-compose.yaml and docker/*.Dockerfile: what an operator relies on when
running `docker compose build && docker compose up`.

There is no Docker engine here, so the files are only parsed; every check is about wiring that
would otherwise only break at deploy time: a dangling depends_on, a connection pointing at a host
that is not a service, an undeclared volume, Spark or Python versions that differ between the
driver and the executors, a setting the service reads that nobody sets, a volume its writer
cannot write.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yaml"
AIRFLOW_DOCKERFILE = "docker/airflow.Dockerfile"
SPARK_DOCKERFILE = "docker/spark.Dockerfile"
DAGS_MOUNT = "/opt/airflow/dags"
ARCHIVE_MOUNT = "/opt/retry-archive"

AIRFLOW_SERVICES = (
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-worker",
    "airflow-triggerer",
)
LONG_RUNNING_AIRFLOW_SERVICES = tuple(name for name in AIRFLOW_SERVICES if name != "airflow-init")
EXPECTED_SERVICES = {"kafka", "postgres", "redis", "spark-master", "spark-worker", *AIRFLOW_SERVICES}
CONNECTION_VARS = ("AIRFLOW_CONN_RETRY_POSTGRES", "AIRFLOW_CONN_RETRY_KAFKA", "AIRFLOW_CONN_SPARK_DEFAULT")


# --- helpers -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    assert COMPOSE_FILE.is_file(), f"{COMPOSE_FILE} is missing"
    doc = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(doc, dict), "docker-compose.yaml must be a mapping"
    assert isinstance(doc.get("services"), dict), "docker-compose.yaml has no services mapping"
    return doc


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def env_of(service: dict[str, Any]) -> dict[str, str]:
    """The service environment as strings, whichever of the two compose syntaxes is used."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        pairs = (item.split("=", 1) for item in raw)
        return {pair[0]: pair[1] if len(pair) == 2 else "" for pair in pairs}
    return {str(key): "" if value is None else str(value) for key, value in raw.items()}


def depends_on_of(service: dict[str, Any]) -> dict[str, str]:
    """depends_on as {service: condition}; the short (list) syntax means service_started."""
    raw = service.get("depends_on") or {}
    if isinstance(raw, list):
        return {str(name): "service_started" for name in raw}
    return {str(name): (spec or {}).get("condition", "service_started") for name, spec in raw.items()}


def command_text(service: dict[str, Any]) -> str:
    command = service.get("command", "")
    return " ".join(command) if isinstance(command, list) else str(command)


def published_ports(service: dict[str, Any]) -> set[tuple[str, str]]:
    """(host port, container port) pairs from the short ("8080:8080") or long port syntax."""
    ports: set[tuple[str, str]] = set()
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            ports.add((str(entry.get("published", "")), str(entry.get("target", ""))))
            continue
        parts = str(entry).split("/")[0].split(":")
        if len(parts) >= 2:
            ports.add((parts[-2], parts[-1]))
    return ports


def mounts_of(service: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) for each entry of `volumes`, short or long syntax."""
    mounts: list[tuple[str, str, bool]] = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            mounts.append((str(entry.get("source", "")), str(entry["target"]), bool(entry.get("read_only"))))
            continue
        parts = str(entry).split(":")
        if len(parts) == 1:  # anonymous volume
            mounts.append(("", parts[0], False))
        else:
            mode = parts[2] if len(parts) > 2 else ""
            mounts.append((parts[0], parts[1], "ro" in mode.split(",")))
    return mounts


def is_named_volume(source: str) -> bool:
    return bool(source) and not source.startswith((".", "/", "~", "$"))


def dangling_dependencies(doc: dict[str, Any]) -> list[str]:
    names = set(doc.get("services") or {})
    return sorted(
        f"{name} -> {dep}"
        for name, service in (doc.get("services") or {}).items()
        for dep in depends_on_of(service)
        if dep not in names
    )


def undeclared_volumes(doc: dict[str, Any]) -> list[str]:
    declared = set(doc.get("volumes") or {})
    return sorted(
        f"{name}: {source}"
        for name, service in (doc.get("services") or {}).items()
        for source, _target, _ro in mounts_of(service)
        if is_named_volume(source) and source not in declared
    )


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


# --- the helpers themselves catch what they are meant to catch ------------------------------------------


def test_checks_detect_broken_wiring() -> None:
    broken: dict[str, Any] = {
        "services": {
            "app": {"depends_on": {"db": {"condition": "service_healthy"}}, "volumes": ["data:/data"]},
            "other": {"depends_on": ["app"], "volumes": ["./src:/src:ro", "/abs:/abs"]},
        },
        "volumes": {},
    }
    assert dangling_dependencies(broken) == ["app -> db"]
    assert undeclared_volumes(broken) == ["app: data"]
    assert mounts_of(broken["services"]["other"]) == [("./src", "/src", True), ("/abs", "/abs", False)]


# --- services ---------------------------------------------------------------------------------------------


def test_expected_services_exist(services: dict[str, dict[str, Any]]) -> None:
    missing = EXPECTED_SERVICES - set(services)
    assert not missing, f"services missing from docker-compose.yaml: {sorted(missing)}"


def test_depends_on_references_existing_services(compose: dict[str, Any]) -> None:
    assert dangling_dependencies(compose) == []


def test_every_named_volume_is_declared(compose: dict[str, Any]) -> None:
    assert undeclared_volumes(compose) == []


def test_stateful_services_keep_data_on_named_volumes(services: dict[str, dict[str, Any]]) -> None:
    for name, data_dir in (("postgres", "/var/lib/postgresql/data"), ("kafka", "/var/lib/kafka/data")):
        targets = {target: source for source, target, _ro in mounts_of(services[name])}
        assert data_dir in targets, f"{name} does not persist {data_dir}"
        assert is_named_volume(targets[data_dir]), f"{name} data should live on a named volume"


def test_infrastructure_has_healthchecks(services: dict[str, dict[str, Any]]) -> None:
    for name in ("kafka", "postgres", "airflow-apiserver"):
        test = (services[name].get("healthcheck") or {}).get("test")
        assert test, f"{name} needs a healthcheck: others wait on service_healthy"


# --- Kafka ------------------------------------------------------------------------------------------------


def test_kafka_runs_kraft_without_zookeeper(services: dict[str, dict[str, Any]]) -> None:
    kafka = services["kafka"]
    assert str(kafka.get("image", "")).startswith("apache/kafka:")
    env = env_of(kafka)
    roles = {role.strip() for role in env.get("KAFKA_PROCESS_ROLES", "").split(",")}
    assert {"broker", "controller"} <= roles
    assert "KAFKA_ZOOKEEPER_CONNECT" not in env
    zookeepers = [
        name
        for name, service in services.items()
        if "zookeeper" in name.lower() or "zookeeper" in str(service.get("image", "")).lower()
    ]
    assert zookeepers == []


def test_kafka_is_reachable_as_kafka_9092_and_never_auto_creates(
    services: dict[str, dict[str, Any]],
) -> None:
    env = env_of(services["kafka"])
    assert "kafka:9092" in env.get("KAFKA_ADVERTISED_LISTENERS", "")
    assert env.get("KAFKA_AUTO_CREATE_TOPICS_ENABLE") == "false"


# --- PostgreSQL -------------------------------------------------------------------------------------------


def test_postgres_creates_both_databases(compose: dict[str, Any]) -> None:
    postgres = compose["services"]["postgres"]
    assert str(postgres.get("image", "")).startswith("postgres:16")
    assert env_of(postgres).get("POSTGRES_DB") == "airflow"
    init_sql = ""
    for ref in postgres.get("configs") or []:
        source = ref["source"] if isinstance(ref, dict) else ref
        target = ref.get("target", "") if isinstance(ref, dict) else ""
        assert source in (compose.get("configs") or {}), f"config {source!r} is not declared"
        if target.startswith("/docker-entrypoint-initdb.d/"):
            init_sql += compose["configs"][source].get("content", "")
    assert "create database retry_scheduler" in init_sql.lower()


# --- Airflow ----------------------------------------------------------------------------------------------


def test_airflow_services_share_the_image_built_here_and_mount_the_dags(
    services: dict[str, dict[str, Any]],
) -> None:
    images = {services[name].get("image") for name in AIRFLOW_SERVICES}
    assert len(images) == 1, f"Airflow services run different images: {images}"
    for name in AIRFLOW_SERVICES:
        build = services[name].get("build") or {}
        assert build.get("dockerfile") == AIRFLOW_DOCKERFILE and build.get("context") == ".", name
        assert ("./dags", DAGS_MOUNT, True) in mounts_of(services[name]), f"{name} does not mount ./dags ro"
        assert "_PIP_ADDITIONAL_REQUIREMENTS" not in env_of(services[name]), "the image has the project"


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_service_finds_dags_and_runs_celery(services: dict[str, dict[str, Any]], name: str) -> None:
    env = env_of(services[name])
    assert env.get("AIRFLOW__CORE__DAGS_FOLDER") == DAGS_MOUNT
    assert (REPO_ROOT / "dags" / "retry_scheduler_dag.py").is_file()
    # The plugin comes from the installed wheel's entry point: no plugins folder is mounted.
    assert not any(target.startswith("/opt/airflow/plugins") for _s, target, _ro in mounts_of(services[name]))
    assert env.get("AIRFLOW__CORE__EXECUTOR") == "CeleryExecutor"
    assert urlsplit(env["AIRFLOW__CELERY__BROKER_URL"]).hostname == "redis"
    assert "postgres:5432/airflow" in env["AIRFLOW__CELERY__RESULT_BACKEND"]


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_service_has_the_connections(services: dict[str, dict[str, Any]], name: str) -> None:
    env = env_of(services[name])
    missing = [var for var in CONNECTION_VARS if not env.get(var)]
    assert not missing, f"{name} lacks {missing}"

    postgres = urlsplit(env["AIRFLOW_CONN_RETRY_POSTGRES"])
    assert postgres.scheme in {"postgres", "postgresql"}
    assert (postgres.hostname, postgres.port, postgres.path) == ("postgres", 5432, "/retry_scheduler")
    assert env.get("RETRY_DATABASE_URL") == env["AIRFLOW_CONN_RETRY_POSTGRES"]

    kafka = json.loads(env["AIRFLOW_CONN_RETRY_KAFKA"])
    assert kafka["conn_type"] == "kafka"
    bootstrap = kafka["extra"]["bootstrap.servers"]
    for address in bootstrap.split(","):
        host, _port = host_port(address)
        assert host in services, f"bootstrap server {address!r} is not a compose service"
    assert host_port(bootstrap) == ("kafka", 9092)
    assert env.get("KAFKA_BOOTSTRAP_SERVERS") == bootstrap

    spark = urlsplit(env["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert (spark.scheme, spark.hostname, spark.port) == ("spark", "spark-master", 7077)

    assert env.get("RETRY_CREATE_TOPICS") == "true", (
        "Kafka auto-create is off: the service must create topics"
    )


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_metadata_database(services: dict[str, dict[str, Any]], name: str) -> None:
    url = urlsplit(env_of(services[name]).get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", ""))
    assert url.scheme.startswith("postgresql")
    assert (url.hostname, url.path) == ("postgres", "/airflow")


@pytest.mark.parametrize("name", LONG_RUNNING_AIRFLOW_SERVICES)
def test_airflow_service_waits_for_its_dependencies(services: dict[str, dict[str, Any]], name: str) -> None:
    deps = depends_on_of(services[name])
    assert deps.get("postgres") == "service_healthy"
    assert deps.get("kafka") == "service_healthy"
    assert deps.get("redis") == "service_healthy"
    assert deps.get("airflow-init") == "service_completed_successfully"


def test_airflow_init_migrates_both_databases_once(services: dict[str, dict[str, Any]]) -> None:
    init = services["airflow-init"]
    command = command_text(init)
    assert "airflow db migrate" in command
    assert "retry-scheduler db migrate" in command
    # The always-on DAGs exist (reserialized from the mounted folder) and are unpaused before the
    # scheduler starts; the manual and daily ones stay paused.
    steps = [step.strip() for step in command.split("&&")]
    assert steps.index("airflow dags reserialize") < steps.index("airflow dags unpause retry_scheduler")
    assert {"airflow dags unpause retry_scheduler", "airflow dags unpause retry_monitor"} <= set(steps)
    assert not [
        step
        for step in steps
        if "unpause" in step and "retry_scheduler" not in step and "retry_monitor" not in step
    ]
    # service_completed_successfully never fires for a container that is restarted forever.
    assert str(init.get("restart", "no")) == "no"


def test_api_server_publishes_8080(services: dict[str, dict[str, Any]]) -> None:
    apiserver = services["airflow-apiserver"]
    assert command_text(apiserver).split()[:1] == ["api-server"]
    assert ("8080", "8080") in published_ports(apiserver)
    assert "/api/v2/monitor/health" in " ".join(apiserver["healthcheck"]["test"])


# --- Spark ------------------------------------------------------------------------------------------------


def test_spark_cluster_matches_spark_default(services: dict[str, dict[str, Any]]) -> None:
    master, worker = services["spark-master"], services["spark-worker"]
    for service in (master, worker):
        assert (service.get("build") or {}).get("dockerfile") == SPARK_DOCKERFILE
    assert master.get("image") == worker.get("image")
    assert "org.apache.spark.deploy.master.Master" in command_text(master)
    worker_command = command_text(worker)
    assert "org.apache.spark.deploy.worker.Worker" in worker_command
    spark_default = urlsplit(env_of(services["airflow-worker"])["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert f"spark://{spark_default.hostname}:{spark_default.port}" in worker_command.split()
    assert "deploy-mode=client" in spark_default.query  # the driver reads its connection file beside the task


# --- the images ---------------------------------------------------------------------------------------------


def dockerfile(path: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = (REPO_ROOT / path).read_text(encoding="utf-8")
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending, f"{path} ends inside a continued line"
    known = {"FROM", "ARG", "RUN", "COPY", "ENV", "USER", "WORKDIR", "ENTRYPOINT", "CMD", "LABEL", "EXPOSE"}
    parsed = []
    for line in lines:
        instruction, _, args = line.partition(" ")
        assert instruction.upper() in known, f"{path}: unknown instruction {instruction!r}"
        parsed.append((instruction.upper(), args.strip()))
    return parsed


def build_args(path: str) -> dict[str, str]:
    """The ARG defaults of a Dockerfile (what `docker compose build` uses unless told otherwise)."""
    defaults: dict[str, str] = {}
    for instruction, args in dockerfile(path):
        if instruction == "ARG" and "=" in args:
            name, _, value = args.partition("=")
            defaults.setdefault(name, value)
    return defaults


def base_images(path: str) -> list[str]:
    """The FROM images of each stage, with the ARG defaults filled in."""
    args = build_args(path)
    images = []
    for instruction, text in dockerfile(path):
        if instruction == "FROM":
            image = text.split()[0]
            images.append(re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image))
    return images


def pinned(name: str) -> str:
    """The version the project pins for ``name`` (``==``) in its extras."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    for extra in project["optional-dependencies"].values():
        for requirement in extra:
            if requirement.startswith(f"{name}=="):
                return str(requirement.split("==", 1)[1])
    raise AssertionError(f"{name} is not pinned in pyproject.toml")


@pytest.mark.parametrize("path", [AIRFLOW_DOCKERFILE, SPARK_DOCKERFILE])
def test_the_dockerfiles_parse_and_install_the_project_s_wheel(path: str) -> None:
    steps = dockerfile(path)
    assert steps[0][0] in ("ARG", "FROM") and any(i == "FROM" for i, _ in steps)
    runs = " ".join(args for i, args in steps if i == "RUN")
    assert "pip wheel --no-deps" in runs and "kafka_retry_scheduler-*.whl)[" in runs
    assert "default-jre-headless" in runs, f"{path}: Spark needs a Java runtime"
    for instruction, args in steps:
        if instruction == "COPY" and not args.startswith("--from"):
            for source in args.replace("--chown=airflow:0", "").split()[:-1]:
                assert (REPO_ROOT / source).exists(), (
                    f"{path} copies {source}, which is not in the repository"
                )


def test_spark_is_the_same_version_on_the_driver_and_the_executors() -> None:
    pyspark = pinned("pyspark")
    assert build_args(SPARK_DOCKERFILE)["SPARK_VERSION"] == pyspark
    spark_runs = " ".join(args for i, args in dockerfile(SPARK_DOCKERFILE) if i == "RUN")
    assert '"pyspark==${SPARK_VERSION}"' in spark_runs and "[service,spark]" in spark_runs
    # The Airflow image gets pyspark through the wheel's spark extra, pinned to the same release.
    airflow_runs = " ".join(args for i, args in dockerfile(AIRFLOW_DOCKERFILE) if i == "RUN")
    assert "[airflow,spark]" in airflow_runs
    assert pinned("pyspark-client") == pyspark


def test_the_driver_and_the_executors_run_the_same_python_minor_version(
    services: dict[str, dict[str, Any]],
) -> None:
    airflow_base = base_images(AIRFLOW_DOCKERFILE)[-1]
    spark_base = base_images(SPARK_DOCKERFILE)[-1]
    driver = re.search(r"-python(3\.\d+)$", airflow_base)
    executors = re.match(r"python:(3\.\d+)-", spark_base)
    assert driver and executors, (airflow_base, spark_base)
    assert driver.group(1) == executors.group(1)
    # The executors' Python workers are started with exactly that interpreter.
    assert env_of(services["airflow-worker"])["RETRY_SPARK_EXECUTOR_PYTHON"] == f"python{executors.group(1)}"
    requires = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11" and tuple(map(int, driver.group(1).split("."))) >= (3, 11)


#: Settings the service reads that the stack leaves at their defaults, and why the default is right.
DEFAULTS_ARE_RIGHT = {
    "RETRY_ADOPT_TOPICS": "none: a deployment names its other tools' dead-letter topics itself",
    "RETRY_ALERT_CHANNELS": "alert channels are declared in dags/retry_policies.py (ALERT_CHANNELS)",
    "RETRY_CONSUMER_GROUP": "one service per Kafka cluster: the default group is its own",
    "RETRY_TOPIC": "the contract's retry topic",
    "RETRY_DELAY_TOPICS": "none: delays come from retry.at and the policies",
    "RETRY_HOLDS_TOPICS": "the consumer helpers use the default holds topic, retry.holds, always refused",
    "RETRY_DELIVERY_TIMEOUT_MS": "tuned default",
    "RETRY_DESTINATION_ALLOWLIST": "destinations are declared in dags/retry_policies.py",
    "RETRY_INGEST_BATCH": "tuned default",
    "RETRY_INGEST_WORKERS": "tuned default",
    "RETRY_KAFKA_CONFIG": "plaintext Kafka inside the stack; the Airflow connection's extra for the tasks",
    "RETRY_LEASE_MS": "tuned default",
    "RETRY_LOOP_GRACE_MS": "tuned default",
    "RETRY_MAX_CLOCK_SKEW_MS": "tuned default",
    "RETRY_MAX_HEADER_NAME_CHARS": "protocol limit",
    "RETRY_MAX_RECORD_BYTES": "the broker's default message.max.bytes",
    "RETRY_MAX_RETRY_AHEAD_MS": "tuned default",
    "RETRY_PARK_AFTER_REPLAYS": "three replays, then parked",
    "RETRY_REPLAY_APPROVAL_ABOVE": "off: the size that needs a second person is each deployment's own",
    "RETRY_POLICIES": "retry_policies.py in the DAGs folder",
    "RETRY_POLL_INTERVAL_MS": "tuned default",
    "RETRY_PUBLISH_BATCH": "tuned default",
    "RETRY_PUBLISH_WORKERS": "tuned default",
    "RETRY_PUBLISH_TASKS": "one Celery worker: one publish task per run (raise both together)",
    "RETRY_STATEMENT_TIMEOUT_MS": "five minutes",
    "RETRY_SELF_VACUUM": "on: it acts only where the server's autovacuum does not cover retry_jobs",
    "RETRY_TOPIC_REPLICATION_FACTOR": "3, or the cluster's brokers when fewer: one here",
    "RETRY_TOPIC_MIN_INSYNC_REPLICAS": "to match the replicas: 1 on one broker",
    "RETRY_TOPIC_RETENTION_MS": "seven days, Kafka's own default, stated on the retry topics",
    "RETRY_TOPIC_RETENTION_BYTES": "no size bound: time alone removes retries",
    "RETRY_WEB_POOL_SIZE": "tuned default",
    "RETRY_SPARK_JARS": "the image's /usr/share/java/postgresql.jar (libpostgresql-jdbc-java)",
    "RETRY_SPARK_PACKAGES": "the JDBC jar is in the image: nothing to download",
    "RETRY_SPARK_CLASS_ARCHIVE": "none is written in the image: jobs start without it",
    "RETRY_SPARK_EXECUTOR_ARCHIVE": "packed on the first submission into RETRY_DEV_HOME",
    "RETRY_SPARK_LOCAL_NICE": "the jobs run on the Spark cluster: it applies to local mode only",
}
#: Read only by the dev tooling and the chaos harness, never by a deployed service.
DEV_ONLY = {
    "RETRY_DEV_API_HOST",
    "RETRY_DEV_METADATA_DB",
    "RETRY_DEV_REDIS_URL",
    "RETRY_FAULT",
    "RETRY_KAFKA_LIBS",
    "KAFKA_HEAP_OPTS",
}


def settings_read_by_the_service() -> set[str]:
    """Every ``RETRY_*`` / ``KAFKA_*`` variable named in the package's code."""
    names: set[str] = set()
    for path in (REPO_ROOT / "plugins" / "retry_scheduler").rglob("*.py"):
        names |= set(re.findall(r"\"((?:RETRY|KAFKA)_[A-Z0-9_]+)\"", path.read_text(encoding="utf-8")))
    return names


def test_every_setting_the_service_reads_is_set_or_its_default_is_right_here(
    services: dict[str, dict[str, Any]],
) -> None:
    read = settings_read_by_the_service()
    assert {
        "RETRY_DATABASE_URL",
        "RETRY_ARCHIVE_URI",
        "RETRY_SPARK_EXECUTOR_PYTHON",
    } <= read  # the scan works
    env = env_of(services["airflow-worker"])
    unset = sorted(read - set(env) - set(DEFAULTS_ARE_RIGHT) - DEV_ONLY)
    assert unset == [], f"set these in docker-compose.yaml or say why the default is right: {unset}"
    assert sorted(set(DEFAULTS_ARE_RIGHT) - read) == [], "settings the code no longer reads"
    for name in AIRFLOW_SERVICES:  # every Airflow container has the same settings as the worker
        assert set(env) - {"DUMB_INIT_SETSID"} <= set(env_of(services[name])), f"{name} misses settings"


def test_every_volume_a_service_writes_is_writable_by_it(services: dict[str, dict[str, Any]]) -> None:
    """Named volumes written by our images: the writers share one uid, and the images own the mount point."""
    writers: dict[str, set[str]] = {}
    for name, service in services.items():
        if "build" not in service:
            continue  # kafka, postgres, redis: their images own their data directories
        for source, _target, read_only in mounts_of(service):
            if is_named_volume(source) and not read_only:
                writers.setdefault(source, set()).add(name)
                user = str(service.get("user", ""))
                assert user == "${AIRFLOW_UID:-50000}:0", f"{name} writes {source} as {user!r}"
    assert writers["retry-archive"] >= {"airflow-worker", "spark-worker"}
    # A new named volume takes the ownership of the image's mount point: both images create it for
    # uid 50000, group 0 writable (an AIRFLOW_UID other than 50000 writes through group 0).
    for path in (AIRFLOW_DOCKERFILE, SPARK_DOCKERFILE):
        runs = " ".join(args for i, args in dockerfile(path) if i == "RUN")
        assert ARCHIVE_MOUNT in runs and "chmod -R g+rwX" in runs, path
    archive = urlsplit(env_of(services["airflow-worker"])["RETRY_ARCHIVE_URI"])
    assert (archive.scheme, archive.path) == ("file", ARCHIVE_MOUNT)
    for name in ("airflow-worker", "spark-worker"):
        assert ("retry-archive", ARCHIVE_MOUNT, False) in mounts_of(services[name])


def test_the_ui_login_is_created_from_the_env_file(services: dict[str, dict[str, Any]]) -> None:
    env = env_of(services["airflow-init"])
    assert env["_AIRFLOW_WWW_USER_CREATE"] == "true"
    assert env["_AIRFLOW_WWW_USER_PASSWORD"].startswith(
        "${_AIRFLOW_WWW_USER_PASSWORD:?"
    )  # no default password
    assert "FabAuthManager" in env["AIRFLOW__CORE__AUTH_MANAGER"]
    header = COMPOSE_FILE.read_text().split("name:", 1)[0]
    assert "_AIRFLOW_WWW_USER_PASSWORD" in header and "AIRFLOW_JWT_SECRET" in header


# --- Safe by default ----------------------------------------------------------------------------------------


def test_published_ports_listen_on_localhost_unless_told_otherwise(
    services: dict[str, dict[str, Any]],
) -> None:
    """The broker's host listener has no authentication: nothing is published on every interface by default."""
    published = {
        name: [str(p) for p in service.get("ports") or []]
        for name, service in services.items()
        if service.get("ports")
    }
    assert set(published) == {"kafka", "airflow-apiserver", "spark-master"}
    for name, ports in published.items():
        for port in ports:
            assert port.startswith("${BIND_ADDRESS:-127.0.0.1}:"), (name, port)


def test_no_password_is_a_constant_of_the_file(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    assert "airflow:airflow@" not in text
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    for name in AIRFLOW_SERVICES:
        env = env_of(services[name])
        for var in (
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
            "AIRFLOW_CONN_RETRY_POSTGRES",
            "RETRY_DATABASE_URL",
        ):
            assert urlsplit(env[var]).password == "${POSTGRES_PASSWORD}", (name, var)
        assert "${POSTGRES_PASSWORD" in env["AIRFLOW__CELERY__RESULT_BACKEND"]


def test_the_env_example_names_every_variable_the_file_needs() -> None:
    """Every ``${VAR}`` the compose file reads is in .env.example, and .env is neither committed nor built in."""
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    needed = set(re.findall(r"(?<!\$)\$\{([A-Z_][A-Z0-9_]*)", text))  # $${X}: the container's own
    example = (REPO_ROOT / ".env.example").read_text(encoding="utf-8")
    declared = set(re.findall(r"^([A-Z_][A-Z0-9_]*)=", example, re.MULTILINE))
    optional = {"_AIRFLOW_WWW_USER_USERNAME", "SPARK_WORKER_CORES", "SPARK_WORKER_MEMORY"}  # defaults fit
    assert needed - optional <= declared, sorted(needed - optional - declared)
    assert ".env" in (REPO_ROOT / ".gitignore").read_text().split()
    assert ".env" in (REPO_ROOT / ".dockerignore").read_text().split()


def test_the_spark_image_has_a_user_for_the_uid_the_services_run_as(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in ("spark-master", "spark-worker"):
        service = services[name]
        assert service["user"] == "${AIRFLOW_UID:-50000}:0"
        assert service["build"]["args"]["SPARK_UID"] == "${AIRFLOW_UID:-50000}"
    dockerfile = (REPO_ROOT / SPARK_DOCKERFILE).read_text()
    assert "ARG SPARK_UID" in dockerfile and 'useradd --uid "${SPARK_UID}"' in dockerfile
