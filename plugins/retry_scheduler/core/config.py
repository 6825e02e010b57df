"""Service settings, read from the environment with embedded-dev defaults.

Every knob has a default that works with ``make up`` on one machine; production
deployments override them with environment variables (or, inside Airflow, with
the ``retry_postgres`` / ``retry_kafka`` connections, see ``retry_scheduler.airflow``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from retry_scheduler.core.protocol import HOLDS_TOPIC
from retry_scheduler.core.setting_checks import check_settings
from retry_scheduler.core.setting_values import (
    ConfigError,
    env_bool,
    env_int,
    kafka_config_from_json,
    parse_adopt_setting,
    parse_delay_topics,
    parse_holds_topics,
)

#: The policies module's file name, looked up next to the DAGs.
POLICIES_FILE = "retry_policies.py"

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/retry_scheduler"
DEFAULT_BOOTSTRAP_SERVERS = "localhost:9092"


def dags_folder(env: Mapping[str, str] | None = None) -> Path:
    """Airflow's DAGs folder as the environment gives it, without importing Airflow.

    ``AIRFLOW__CORE__DAGS_FOLDER`` when set, else ``$AIRFLOW_HOME/dags`` (``~/airflow/dags``).
    """
    env = os.environ if env is None else env
    if env.get("AIRFLOW__CORE__DAGS_FOLDER"):
        return Path(env["AIRFLOW__CORE__DAGS_FOLDER"]).expanduser()
    return Path(env.get("AIRFLOW_HOME") or "~/airflow").expanduser() / "dags"


#: ``RETRY_POLICIES=builtin``: the policies shipped in the package (a conservative ``default``, no
#: destination allowed), asked for by name: never a silent fallback.
BUILTIN_POLICIES = "builtin"


def builtin_policies_path() -> Path:
    return Path(str(resources.files("retry_scheduler.core").joinpath("default_policies.py")))


def default_policies_path(env: Mapping[str, str] | None = None, also_looked: Sequence[str] = ()) -> Path:
    """Where the policies module is when ``RETRY_POLICIES`` does not say.

    ``retry_policies.py`` next to the DAGs (Airflow's DAGs folder), else in ``./dags`` (a project
    checkout run from its root). Not found: a :class:`ConfigError` naming every place looked
    (``also_looked`` first: the DAGs folder of Airflow's configuration, which the caller read).
    """
    looked = list(also_looked)
    for folder in (dags_folder(env), Path("dags")):
        candidate = folder / POLICIES_FILE
        if candidate.is_file():
            return candidate.resolve()
        looked.append(str(candidate.absolute()))
    raise ConfigError(
        f"no retry policies module: RETRY_POLICIES is not set and there is no {POLICIES_FILE} at "
        + ", ".join(dict.fromkeys(looked))
        + ". Create one (docs/guide/policies.md), set RETRY_POLICIES to its path (the files of a DAG bundle "
        f"are not searched), or set RETRY_POLICIES={BUILTIN_POLICIES} for the package's own (a "
        "conservative default policy, and no destination allowed)"
    )


def dev_home(env: Mapping[str, str] | None = None) -> Path:
    """Where the dev tooling keeps its state (PostgreSQL, Spark's class archive, the archive directory).

    ``RETRY_DEV_HOME`` when set, else ``.dev`` in the current directory (the repository root for
    the Makefile's targets). Absolute, so child processes agree on it.
    """
    env = os.environ if env is None else env
    return Path(env.get("RETRY_DEV_HOME") or ".dev").expanduser().resolve()


def libpq_url(url: str) -> str:
    """``postgresql+psycopg2://...`` (SQLAlchemy's form, what Airflow's ``sql_alchemy_conn`` holds) ->
    ``postgresql://...``: the same server, in the form libpq reads (it knows no driver suffix)."""
    return re.sub(r"^postgres(?:ql)?(?:\+\w+)?://", "postgresql://", url)


def _default_text(value: Any) -> str | None:
    """A field's default as the environment would spell it; None when it has none to speak of."""
    if value in ("", {}, ()):
        return None
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def env(*entries: str | tuple[str, str, str | None]) -> dict[str, Any]:
    """A setting's environment variables, for its field's ``metadata``: ``env(NAME, DOC)``, or
    ``env((NAME, DOC, DEFAULT), ...)`` where ``DEFAULT`` says the default in words (None: none). The
    configuration reference (``docs/configuration.md``) is made from these."""
    if entries and isinstance(entries[0], str):
        name, doc = entries
        return {"env": ((name, doc, ...),)}
    return {"env": tuple(entries)}


@dataclass(frozen=True)
class Settings:
    """Everything the ingest and publish loops need to know.

    Times are in milliseconds, sizes in bytes.
    """

    #: Both may hold passwords: left out of ``repr`` (and so of any log line that shows settings).
    database_url: str = field(
        default=DEFAULT_DATABASE_URL,
        repr=False,
        metadata=env(
            "RETRY_DATABASE_URL", "the retry database (under Airflow: the `retry_postgres` connection)"
        ),
    )
    kafka: dict[str, Any] = field(
        default_factory=lambda: {"bootstrap.servers": DEFAULT_BOOTSTRAP_SERVERS},
        repr=False,
        metadata=env(
            (
                "KAFKA_BOOTSTRAP_SERVERS",
                "Kafka (under Airflow: the `retry_kafka` connection)",
                f"`{DEFAULT_BOOTSTRAP_SERVERS}`",
            ),
            (
                "RETRY_KAFKA_CONFIG",
                'more librdkafka settings as a JSON object, e.g. `{"security.protocol": '
                '"SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "...", '
                '"sasl.password": "..."}`',
                None,
            ),
        ),
    )
    #: The header-driven retry topic.
    retry_topic: str = field(default="retry", metadata=env("RETRY_TOPIC", "the header-driven retry topic"))
    #: Per-delay retry topics: topic -> delay counted from the record timestamp.
    delay_topics: dict[str, int] = field(
        default_factory=dict,
        metadata=env(
            "RETRY_DELAY_TOPICS",
            "per-delay topics, e.g. `retry.5m=5m,retry.1h=1h`, the delay counted from the record timestamp",
        ),
    )
    #: Other tools' dead-letter topics read as dead jobs: topic -> format (``spring``, ``connect``,
    #: ``streams``, ``share``), with ``:retry`` when they are retried by policy instead.
    adopt_topics: dict[str, str] = field(
        default_factory=dict,
        metadata=env(
            "RETRY_ADOPT_TOPICS",
            "other tools' dead-letter topics read as dead jobs, `TOPIC=FORMAT` with `spring`, `connect`, "
            "`streams` (Kafka Streams) or `share` (a share group's), or `TOPIC=FORMAT:retry` to retry "
            "their letters by policy, e.g. `orders-dlt=spring,dlq.work=share:retry`",
        ),
    )
    #: The consumer helpers' holds topics (ordered mode): never destinations. ``retry.holds`` always.
    holds_topics: tuple[str, ...] = field(
        default=(HOLDS_TOPIC,),
        metadata=env(
            (
                "RETRY_HOLDS_TOPICS",
                "holds topics the consumer helpers were given besides `retry.holds` "
                "(`holds_topic=`), comma-separated; never destinations, like `retry.holds`",
                None,
            )
        ),
    )
    consumer_group: str = field(
        default="retry-scheduler", metadata=env("RETRY_CONSUMER_GROUP", "consumer group of the ingest loop")
    )
    #: A regular expression of destinations allowed beyond those the policies module declares
    #: (:mod:`retry_scheduler.core.destinations`); empty: none.
    destination_allowlist: str = field(
        default="",
        metadata=env(
            "RETRY_DESTINATION_ALLOWLIST",
            "a regular expression of destinations allowed beyond those "
            "the policies module declares (denied by default; never internal topics nor the "
            "service's own: retry, per-delay, adopted, DLQ and holds topics)",
        ),
    )
    #: Create missing destination and DLQ topics through the admin API before producing.
    create_topics: bool = field(
        default=False,
        metadata=env(
            "RETRY_CREATE_TOPICS", "create missing destination and DLQ topics (the dev stack: `true`)"
        ),
    )
    #: Replication factor of the topics the service creates (retry, DLQ, redelivery topics): 0, 3 or
    #: the cluster's brokers when fewer (:mod:`retry_scheduler.replication`); -1: the broker's default.
    topic_replication_factor: int = field(
        default=0,
        metadata=env(
            "RETRY_TOPIC_REPLICATION_FACTOR",
            "replication factor of the topics the service creates; `0` (default): 3, or the cluster's "
            "number of brokers when fewer; `-1`: the broker's `default.replication.factor`",
        ),
    )
    #: ``min.insync.replicas`` of the topics the service creates: 0, 2 with three replicas or more,
    #: else 1; -1: the broker's default.
    topic_min_insync_replicas: int = field(
        default=0,
        metadata=env(
            "RETRY_TOPIC_MIN_INSYNC_REPLICAS",
            "`min.insync.replicas` of the topics the service creates; `0` (default): 2 with three "
            "replicas or more, else 1; `-1`: the broker's default",
        ),
    )
    #: ``retention.ms`` of the retry topics the service creates: a record not ingested by then is lost.
    retry_topic_retention_ms: int = field(
        default=7 * 24 * 3600 * 1000,
        metadata=env(
            "RETRY_TOPIC_RETENTION_MS",
            "`retention.ms` of the retry topics the service creates (default 7 days, Kafka's own); "
            "`retry_monitor` alerts when the ingest falls behind by half of it",
        ),
    )
    #: ``retention.bytes`` (per partition) of the retry topics the service creates; -1: no size bound.
    retry_topic_retention_bytes: int = field(
        default=-1,
        metadata=env(
            "RETRY_TOPIC_RETENTION_BYTES",
            "`retention.bytes` (per partition) of the retry topics the service creates; `-1` (default): "
            "no size bound, time alone removes records",
        ),
    )
    #: Records whose key + value + headers exceed this are dead (invalid).
    max_record_bytes: int = field(
        default=1024 * 1024,
        metadata=env(
            "RETRY_MAX_RECORD_BYTES", "records whose key, value and headers are larger are dead (`invalid`)"
        ),
    )
    max_headers: int = 256
    #: ``retry.*`` header values longer than this are invalid (``retry.reason`` is truncated instead).
    max_header_value_bytes: int = 1024
    #: Records with a header name longer than this (in characters) are invalid.
    max_header_name_chars: int = field(
        default=1024,
        metadata=env("RETRY_MAX_HEADER_NAME_CHARS", "records with a longer header name are dead (`invalid`)"),
    )
    #: A record timestamp further than this into the future (or before 2000) is not trusted: the
    #: ingest time is used instead. A ``retry.original-timestamp`` outside that window is invalid.
    max_clock_skew_ms: int = field(
        default=86_400_000,
        metadata=env(
            "RETRY_MAX_CLOCK_SKEW_MS",
            "a record timestamp before 2000 or further ahead than this is "
            "not trusted (the ingest time counts); a `retry.original-timestamp` further ahead is invalid",
        ),
    )
    #: A ``retry.at`` further than this into the future (or before 2000) is invalid.
    max_retry_ahead_ms: int = field(
        default=366 * 86_400_000,
        metadata=env("RETRY_MAX_RETRY_AHEAD_MS", "a `retry.at` further ahead than this is invalid"),
    )
    max_reason_chars: int = 2000
    #: A record replayed from the dead letters this many times that dies again is parked (0: never).
    park_after_replays: int = field(
        default=3,
        metadata=env(
            "RETRY_PARK_AFTER_REPLAYS",
            "a record replayed from the dead letters this many times that dies again is dead as `parked`, "
            "which a replay leaves alone unless asked for it (0: never park)",
        ),
    )
    #: A dlq_replay run that would replay more than this many dead jobs waits for approval (0: never).
    replay_approval_above: int = field(
        default=0,
        metadata=env(
            "RETRY_REPLAY_APPROVAL_ABOVE",
            "a `dlq_replay` run that would replay more than this many dead jobs waits for a second person's "
            "approval in Airflow, shown the dry run's counts per destination (0: never)",
        ),
    )
    ingest_batch: int = field(default=5000, metadata=env("RETRY_INGEST_BATCH", "records per ingest batch"))
    #: Processes the ingest task shares the retry-topic partitions among (at most one per partition).
    ingest_workers: int = field(
        default=2,
        metadata=env(
            "RETRY_INGEST_WORKERS", "processes the ingest task shares the retry-topic partitions among"
        ),
    )
    publish_batch: int = field(default=2000, metadata=env("RETRY_PUBLISH_BATCH", "jobs per publish round"))
    #: Publishers working side by side in the publish task, each with its own connection and producer.
    publish_workers: int = field(
        default=2, metadata=env("RETRY_PUBLISH_WORKERS", "publishers side by side in the publish task")
    )
    #: Publish tasks per ``retry_scheduler`` run (mapped), side by side: on the CeleryExecutor they can
    #: run on different workers. Read when the DAG file is parsed.
    publish_tasks: int = field(
        default=1,
        metadata=env(
            "RETRY_PUBLISH_TASKS",
            "publish tasks each `retry_scheduler` run maps, side by side (read "
            "when the DAG file is parsed; on Celery they spread over the workers)",
        ),
    )
    #: A claimed job not marked within this is claimable again: a dead job's lease on its way to the
    #: DLQ, and the longest a publisher may hold due jobs locked in an idle transaction.
    lease_ms: int = field(
        default=60_000,
        metadata=env(
            "RETRY_LEASE_MS", "how long a dead job's DLQ lease, or a publisher's idle transaction, may last"
        ),
    )
    #: librdkafka delivery timeout; must stay well under the lease.
    delivery_timeout_ms: int = field(
        default=30_000,
        metadata=env("RETRY_DELIVERY_TIMEOUT_MS", "librdkafka's delivery timeout (shorter than the lease)"),
    )
    #: Longest the publish loop sleeps before looking for due jobs again.
    poll_interval_ms: int = field(
        default=100, metadata=env("RETRY_POLL_INTERVAL_MS", "longest the publisher sleeps between due scans")
    )
    #: A loop whose time is up goes on for at most this long until a newer loop is alive.
    loop_grace_ms: int = field(
        default=60_000,
        metadata=env(
            "RETRY_LOOP_GRACE_MS", "how long a loop past its time waits to be relieved by a newer one"
        ),
    )
    #: The publish loop vacuums retry_jobs itself when the server's autovacuum does not (db.vacuum).
    self_vacuum: bool = field(
        default=True,
        metadata=env(
            "RETRY_SELF_VACUUM",
            "the publish loop runs `VACUUM retry_jobs` itself when the server's "
            "autovacuum is off for the table and it has more than 10 000 dead rows plus 1 % of its "
            "live ones (in the background, one at a time, a minute apart at least); `false`: you vacuum",
        ),
    )
    #: The policies module; empty: found by :func:`default_policies_path`.
    policies_path: str = field(
        default="",
        metadata=env(
            (
                "RETRY_POLICIES",
                "the policies module, a folder of them (every `retry_policies*.py` in it), or several of "
                "either, comma-separated; `builtin`: the package's own (`default` only, no destination allowed)",
                "`retry_policies.py` in the DAGs folder (Airflow's `dags_folder`; "
                "`AIRFLOW__CORE__DAGS_FOLDER`, else `$AIRFLOW_HOME/dags`), else `./dags/`; none found is an error",
            )
        ),
    )
    #: Where else the policies module was looked for (the DAGs folder of Airflow's configuration), for
    #: the error when it is found nowhere.
    policies_searched: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "database_url", libpq_url(self.database_url))
        check_settings(self)

    @property
    def policies_files(self) -> list[Path]:
        """Every policies module to load, in order. ``policies_path`` names a module, a folder (every
        ``retry_policies*.py`` in it, by name: one per team, say), or several of either separated by
        commas; ``builtin``: the package's own. Unset: :func:`default_policies_path` (a
        :class:`ConfigError` when there is none)."""
        if not self.policies_path:
            return [default_policies_path(also_looked=self.policies_searched)]
        files: list[Path] = []
        for part in (p.strip() for p in self.policies_path.split(",")):
            if part == BUILTIN_POLICIES:
                files.append(builtin_policies_path())
            elif part and Path(part).is_dir():
                found = sorted(Path(part).glob("retry_policies*.py"))
                if not found:
                    raise ConfigError(f"RETRY_POLICIES: the folder {part} holds no retry_policies*.py")
                files += found
            elif part:
                files.append(Path(part))
        return files

    @property
    def bootstrap_servers(self) -> str:
        return str(self.kafka["bootstrap.servers"])

    @property
    def retry_topics(self) -> list[str]:
        """Every topic the ingest loop consumes: the retry topic, the delay topics, the adopted ones."""
        return [self.retry_topic, *sorted(self.delay_topics), *sorted(self.adopt_topics)]

    @property
    def own_topics(self) -> list[str]:
        """The topics the service and its consumer helper keep for themselves, never destinations
        whatever the allowlist says: the topics the ingest loop reads, and the holds topics. (The DLQ
        topics are the policies'.)"""
        return [*self.retry_topics, *self.holds_topics]

    def with_overrides(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    @classmethod
    def reference(cls) -> list[tuple[str, str, str]]:
        """Every setting read from the environment: (variable, default in words, meaning), in the
        order of the fields, from the fields' own definitions."""
        rows = []
        for f in fields(cls):
            for name, doc, default in f.metadata.get("env", ()):
                if default is ...:
                    value = f.default_factory() if f.default_factory is not MISSING else f.default
                    default = _default_text(value)
                rows.append((name, default or "(none)", doc))
        return rows

    @classmethod
    def env_names(cls) -> frozenset[str]:
        """Every environment variable :meth:`from_env` reads (found by reading them, not listed twice)."""

        class Reads(dict[str, str]):
            def get(self, key: str, default: Any = None) -> Any:
                seen.add(key)
                return default

        seen: set[str] = set()
        cls.from_env(Reads())
        return frozenset(seen)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from environment variables (docs/configuration.md)."""
        env = os.environ if env is None else env
        defaults = cls()
        kafka = {
            **kafka_config_from_json(env.get("RETRY_KAFKA_CONFIG") or "{}", "RETRY_KAFKA_CONFIG"),
            "bootstrap.servers": env.get("KAFKA_BOOTSTRAP_SERVERS") or DEFAULT_BOOTSTRAP_SERVERS,
        }
        return cls(
            database_url=env.get("RETRY_DATABASE_URL") or DEFAULT_DATABASE_URL,
            kafka=kafka,
            retry_topic=env.get("RETRY_TOPIC") or defaults.retry_topic,
            delay_topics=parse_delay_topics(env.get("RETRY_DELAY_TOPICS", "")),
            adopt_topics=parse_adopt_setting(env.get("RETRY_ADOPT_TOPICS", "")),
            holds_topics=parse_holds_topics(env.get("RETRY_HOLDS_TOPICS", "")),
            consumer_group=env.get("RETRY_CONSUMER_GROUP") or defaults.consumer_group,
            destination_allowlist=env.get("RETRY_DESTINATION_ALLOWLIST", ""),
            create_topics=env_bool(env, "RETRY_CREATE_TOPICS", defaults.create_topics),
            topic_replication_factor=env_int(
                env, "RETRY_TOPIC_REPLICATION_FACTOR", defaults.topic_replication_factor
            ),
            topic_min_insync_replicas=env_int(
                env, "RETRY_TOPIC_MIN_INSYNC_REPLICAS", defaults.topic_min_insync_replicas
            ),
            retry_topic_retention_ms=env_int(
                env, "RETRY_TOPIC_RETENTION_MS", defaults.retry_topic_retention_ms
            ),
            retry_topic_retention_bytes=env_int(
                env, "RETRY_TOPIC_RETENTION_BYTES", defaults.retry_topic_retention_bytes
            ),
            max_record_bytes=env_int(env, "RETRY_MAX_RECORD_BYTES", defaults.max_record_bytes),
            max_header_name_chars=env_int(env, "RETRY_MAX_HEADER_NAME_CHARS", defaults.max_header_name_chars),
            max_clock_skew_ms=env_int(env, "RETRY_MAX_CLOCK_SKEW_MS", defaults.max_clock_skew_ms),
            max_retry_ahead_ms=env_int(env, "RETRY_MAX_RETRY_AHEAD_MS", defaults.max_retry_ahead_ms),
            park_after_replays=env_int(env, "RETRY_PARK_AFTER_REPLAYS", defaults.park_after_replays),
            replay_approval_above=env_int(env, "RETRY_REPLAY_APPROVAL_ABOVE", defaults.replay_approval_above),
            ingest_batch=env_int(env, "RETRY_INGEST_BATCH", defaults.ingest_batch),
            ingest_workers=env_int(env, "RETRY_INGEST_WORKERS", defaults.ingest_workers),
            publish_batch=env_int(env, "RETRY_PUBLISH_BATCH", defaults.publish_batch),
            publish_workers=env_int(env, "RETRY_PUBLISH_WORKERS", defaults.publish_workers),
            publish_tasks=env_int(env, "RETRY_PUBLISH_TASKS", defaults.publish_tasks),
            lease_ms=env_int(env, "RETRY_LEASE_MS", defaults.lease_ms),
            delivery_timeout_ms=env_int(env, "RETRY_DELIVERY_TIMEOUT_MS", defaults.delivery_timeout_ms),
            poll_interval_ms=env_int(env, "RETRY_POLL_INTERVAL_MS", defaults.poll_interval_ms),
            loop_grace_ms=env_int(env, "RETRY_LOOP_GRACE_MS", defaults.loop_grace_ms),
            self_vacuum=env_bool(env, "RETRY_SELF_VACUUM", defaults.self_vacuum),
            policies_path=env.get("RETRY_POLICIES") or defaults.policies_path,
        )
