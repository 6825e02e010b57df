"""Static checks of docker-compose.yaml: what an operator relies on when running `docker compose up`.

There is no Docker engine in CI, so the file is only parsed; every check here is about wiring that
would otherwise only break at deploy time (a dangling depends_on, a connection pointing at a host
that is not a service, an undeclared volume, ...).
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yaml"
PROJECT_MOUNT = "/opt/retry-scheduler"

AIRFLOW_SERVICES = (
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
)
LONG_RUNNING_AIRFLOW_SERVICES = tuple(name for name in AIRFLOW_SERVICES if name != "airflow-init")
EXPECTED_SERVICES = {"kafka", "postgres", "spark-master", "spark-worker", *AIRFLOW_SERVICES}
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


def test_airflow_services_share_image_and_mount_the_project(services: dict[str, dict[str, Any]]) -> None:
    images = {services[name].get("image") for name in AIRFLOW_SERVICES}
    assert len(images) == 1, f"Airflow services run different images: {images}"
    assert str(images.pop()).startswith("apache/airflow:3.")
    for name in AIRFLOW_SERVICES:
        assert (".", PROJECT_MOUNT, False) in mounts_of(services[name]), f"{name} does not mount the project"


@pytest.mark.parametrize("name", AIRFLOW_SERVICES)
def test_airflow_service_finds_dags_and_plugins(services: dict[str, dict[str, Any]], name: str) -> None:
    env = env_of(services[name])
    path = PurePosixPath(env.get("AIRFLOW__CORE__DAGS_FOLDER", ""))
    assert path == PurePosixPath(PROJECT_MOUNT) / "dags", f"{name}: AIRFLOW__CORE__DAGS_FOLDER={path}"
    # The mount maps the checkout onto PROJECT_MOUNT, so the folder must exist here too.
    assert (REPO_ROOT / path.relative_to(PROJECT_MOUNT)).is_dir()
    # The plugin comes from the installed package's entry point; a plugins folder inside the mounted
    # checkout would make Airflow import every module of the package as a plugin file.
    plugins = PurePosixPath(env.get("AIRFLOW__CORE__PLUGINS_FOLDER", "/opt/airflow/plugins"))
    assert not plugins.is_relative_to(PROJECT_MOUNT), f"{name}: AIRFLOW__CORE__PLUGINS_FOLDER={plugins}"
    assert "[airflow]" in env.get("_PIP_ADDITIONAL_REQUIREMENTS", ""), f"{name} does not install the package"
    assert env.get("AIRFLOW__CORE__EXECUTOR") == "LocalExecutor"


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
    assert deps.get("airflow-init") == "service_completed_successfully"


def test_airflow_init_migrates_both_databases_once(services: dict[str, dict[str, Any]]) -> None:
    init = services["airflow-init"]
    command = command_text(init)
    assert "airflow db migrate" in command
    assert "retry-scheduler db migrate" in command
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
    assert str(master.get("image", "")).startswith("apache/spark:")
    assert master.get("image") == worker.get("image")
    assert "org.apache.spark.deploy.master.Master" in command_text(master)
    worker_command = command_text(worker)
    assert "org.apache.spark.deploy.worker.Worker" in worker_command
    spark_default = env_of(services["airflow-scheduler"])["AIRFLOW_CONN_SPARK_DEFAULT"]
    assert spark_default in worker_command.split()
    for name in ("spark-master", "spark-worker"):
        assert (".", PROJECT_MOUNT, True) in mounts_of(services[name]), f"{name} must mount the project ro"
