"""retry_monitor's delivery and ingestion checks on the real PostgreSQL and broker: records on the retry
topics not ingested yet (``consumer_lag``), dead jobs off their DLQ topic (``undelivered_dead``), and
deliveries failing again and again (``failing_deliveries``)."""

from __future__ import annotations

from dataclasses import replace

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from bench.jobs import insert_jobs
from retry_scheduler.airflow.notifiers import alert_notifiers
from retry_scheduler.core.config import Settings
from retry_scheduler.core.jobs import Status
from retry_scheduler.db.store import Store
from retry_scheduler.dev.procs import free_port
from retry_scheduler.loops.offsets import ingest_lag
from retry_scheduler.ops.monitor import Thresholds, run_monitor
from tests.integration.test_monitor import WebhookReceiver, make_job
from tests.integration.test_monitor import webhook as webhook  # the fixture
from tests.kafkautil import create_topics, produce

pytestmark = pytest.mark.integration

#: Only the check under test: the others stay quiet.
ONLY = Thresholds(
    oldest_overdue_s=None,
    lateness_p99_s=None,
    dead_per_hour=None,
    stuck_delivery_s=None,
    consumer_lag=None,
    ingest_retention_share=None,
    removed_unread=None,
    undelivered_dead=None,
    failing_deliveries=None,
    stuck_chain_s=None,
    letters_unreadable=None,
    letter_retention_share=None,
)


def lag_reader(settings: Settings, timeout_s: float = 10.0):
    return lambda store: ingest_lag(settings, store.queue.ingest_offsets(settings.consumer_group), timeout_s)


def test_records_not_ingested_yet_are_the_lag_from_postgresql_s_offsets_else_the_group_s(
    database_url: str, bootstrap_servers: str, topic_prefix: str, webhook: WebhookReceiver
) -> None:
    settings = Settings(
        database_url=database_url,
        kafka={"bootstrap.servers": bootstrap_servers},
        retry_topic=f"{topic_prefix}-retry",
        consumer_group=f"{topic_prefix}-scheduler",
        delay_topics={f"{topic_prefix}-retry-never-created": 60_000},
    )
    create_topics(bootstrap_servers, [settings.retry_topic], partitions=2)
    for partition, count in ((0, 7), (1, 3)):  # batches of several records: the high watermark counts each
        produce(bootstrap_servers, settings.retry_topic, [{"value": b"r"}] * count, partition=partition)
    check = replace(ONLY, consumer_lag=4)

    nothing_ingested = run_monitor(database_url, check, alert_notifiers(), lag=lag_reader(settings))
    # ingestion stored 5 records of partition 0 (PostgreSQL's offset); the group committed 2 of partition 1
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO retry_ingest_offsets (consumer_group, topic, partition, next_offset) VALUES (%s, %s, 0, 5)",
            [settings.consumer_group, settings.retry_topic],
        )
    group = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": settings.consumer_group})
    group.commit(offsets=[TopicPartition(settings.retry_topic, 1, 2)], asynchronous=False)
    group.close()
    caught_up = run_monitor(database_url, check, alert_notifiers(), lag=lag_reader(settings))

    reading = nothing_ingested["reading"]
    assert (reading["consumer_lag"], reading["lag_by_topic"]) == (10, {settings.retry_topic: 10})
    assert caught_up["reading"]["consumer_lag"] == 2 + 1
    fired, resolved = (post["text"] for post in webhook.delivered())
    assert fired.startswith(
        "[FIRING] retry_monitor: 10 records on the retry topics are not ingested yet (threshold 4)\n"
        f"Behind, by topic: {settings.retry_topic} 10. Is the retry_scheduler DAG's ingest task running"
    )
    assert resolved.startswith("[RESOLVED] retry_monitor: consumer_lag back to normal: 3 records")


def test_retries_waiting_near_their_topic_s_retention_and_retries_removed_unread_alert(
    database_url: str, bootstrap_servers: str, topic_prefix: str, webhook: WebhookReceiver
) -> None:
    """A retry topic that keeps records 2 minutes: its oldest record not ingested was written 80 s
    ago (67 % of it), then the broker removes two records the ingest never read (DeleteRecords moves
    the partition's start as retention does)."""
    import time

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    settings = Settings(
        database_url=database_url,
        kafka={"bootstrap.servers": bootstrap_servers},
        retry_topic=f"{topic_prefix}-retry",
        consumer_group=f"{topic_prefix}-scheduler",
    )
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    topic = NewTopic(settings.retry_topic, 1, 1, config={"retention.ms": "120000"})
    admin.create_topics([topic])[settings.retry_topic].result(timeout=15)
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    written = int(time.time() * 1000) - 80_000
    for n in range(4):
        producer.produce(settings.retry_topic, value=b"r%d" % n, timestamp=written + n)
    assert producer.flush(15) == 0
    with psycopg.connect(database_url) as conn:  # the ingest stands at the partition's first record
        conn.execute(
            "INSERT INTO retry_ingest_offsets (consumer_group, topic, partition, next_offset) VALUES (%s, %s, 0, 0)",
            [settings.consumer_group, settings.retry_topic],
        )
    check = replace(ONLY, ingest_retention_share=0.5, removed_unread=0)

    near = run_monitor(database_url, check, alert_notifiers(), lag=lag_reader(settings))
    [deleted] = admin.delete_records([TopicPartition(settings.retry_topic, 0, 2)]).values()
    assert deleted.result(timeout=15).low_watermark == 2
    removed = run_monitor(database_url, check, alert_notifiers(), lag=lag_reader(settings))

    reading = near["reading"]
    assert near["firing"] == ["ingest_near_retention"]
    assert 0.6 < reading["lag_retention_share"] < 0.8 and reading["lag_retention_ms"] == 120_000
    assert reading["lag_retention_topic"] == settings.retry_topic and reading["removed_unread"] == {}
    assert removed["reading"]["removed_unread"] == {settings.retry_topic: 2}
    assert removed["firing"] == ["ingest_near_retention", "removed_unread"]
    texts = [post["text"] for post in webhook.delivered()]
    assert texts[0].startswith(
        f"[FIRING] retry_monitor: the oldest record not ingested on {settings.retry_topic} is 6"
    )
    assert "keeps records for 120.0 s (retention.ms)" in texts[0]
    assert texts[1].startswith(
        "[FIRING] retry_monitor: 2 records were removed from the retry topics before the ingest read them "
        "(threshold 0)"
    )


def test_a_broker_out_of_reach_leaves_the_lag_unjudged_and_the_other_checks_running(
    database_url: str, webhook: WebhookReceiver
) -> None:
    settings = Settings(database_url=database_url, kafka={"bootstrap.servers": f"127.0.0.1:{free_port()}"})
    with Store(database_url) as store:
        insert_jobs(store, [make_job(1, due_s_ago=120)])

    result = run_monitor(
        database_url,
        replace(ONLY, consumer_lag=0, oldest_overdue_s=60),
        alert_notifiers(),
        lag=lag_reader(settings, 2),
    )

    assert result["reading"]["consumer_lag"] is None
    assert result["reading"]["lag_error"].startswith("KafkaException")
    assert result["firing"] == ["oldest_overdue"]
    [fired] = webhook.delivered()
    assert fired["alert"]["fields"]["check"] == "oldest_overdue"


def test_dead_jobs_off_their_dlq_topic_after_a_minute_alert_by_topic_with_the_broker_s_error(
    database_url: str, webhook: WebhookReceiver
) -> None:
    with Store(database_url) as store:
        insert_jobs(store, [make_job(n, status=Status.DEAD) for n in range(1, 5)])
    with psycopg.connect(database_url) as conn:
        # jobs 1-3 died two minutes ago and their DLQ topic refuses them; job 4 died just now
        conn.execute(
            "UPDATE retry_jobs SET dead_at = now() - interval '2 minutes', publish_failures = 3,"
            " last_error = 'delivery failed: Broker: Topic authorization failed' WHERE id <= 3"
        )
    check = replace(ONLY, undelivered_dead=0)

    fired = run_monitor(database_url, check, alert_notifiers())
    with psycopg.connect(database_url) as conn:  # the service was granted the topic: they went out
        conn.execute("UPDATE retry_jobs SET dlq_published_at = now() WHERE id <= 3")
    resolved = run_monitor(database_url, check, alert_notifiers())

    assert fired["reading"]["undelivered_dead"] == 3
    first, last = (post["text"] for post in webhook.delivered())
    assert first == (
        "[FIRING] retry_monitor: 3 dead jobs are not on their DLQ topic 60 s after they died (threshold 0)\n"
        "By topic: retry.dlq 3 (last error: delivery failed: Broker: Topic authorization failed). Fix the "
        "topic (its existence, max.message.bytes, the service's rights) or the records; the publish loop "
        "keeps trying, and `retry-scheduler dlq show` shows a job's last error."
    )
    assert last.startswith("[RESOLVED] retry_monitor: undelivered_dead back to normal: 0 dead jobs")
    assert resolved["reading"]["undelivered_dead"] == 0  # job 4 is still within its minute


def test_deliveries_failing_five_times_in_a_row_alert_per_destination(
    database_url: str, webhook: WebhookReceiver
) -> None:
    with Store(database_url) as store:
        insert_jobs(store, [make_job(1, destination="payments"), make_job(2, destination="orders")])
        insert_jobs(store, [make_job(3, destination="orders")])
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE retry_jobs SET publish_failures = 5, last_error = 'delivery failed: Broker: Unknown topic'"
            " WHERE id = 1"
        )
        conn.execute("UPDATE retry_jobs SET publish_failures = 4, last_error = 'timed out' WHERE id = 2")

    result = run_monitor(database_url, replace(ONLY, failing_deliveries=0), alert_notifiers())

    [alert] = result["alerts"]
    assert alert["title"] == (
        "[FIRING] retry_monitor: 1 jobs failed 5 or more deliveries to their destination in a row (threshold 0)"
    )
    [fired] = webhook.delivered()
    assert "By topic: payments 1 (last error: delivery failed: Broker: Unknown topic)" in fired["text"]
    assert fired["alert"]["fields"]["by_topic"] == {"payments": 1}  # orders' job failed 4 times only


def test_share_group_letters_read_late_or_without_their_record_alert(
    database_url: str, bootstrap_servers: str, topic_prefix: str, webhook: WebhookReceiver
) -> None:
    """A pointer-only letter whose record was 45 s old when read, from a topic keeping records 60 s
    (75 % of its retention), and one whose topic is gone: both checks fire; a higher share does not."""
    import time

    from confluent_kafka.admin import AdminClient, NewTopic

    from retry_scheduler.loops.sources import read_letters
    from tests.integration.test_adopt import share
    from tests.integration.test_loop import new_loop

    work_dlq, work, gone = (f"{topic_prefix}-{t}" for t in ("work.dlq", "work", "gone"))
    loop = new_loop(database_url, bootstrap_servers, topic_prefix, adopt_topics={work_dlq: "share"})
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    made = admin.create_topics([NewTopic(work, 1, 1, config={"retention.ms": "60000"})])
    made[work].result(timeout=15)
    create_topics(bootstrap_servers, [work_dlq, gone])
    produce(bootstrap_servers, work, [{"key": b"w", "value": b"v"}], partition=0,
            config={"message.timeout.ms": 10000})  # fmt: skip
    from confluent_kafka import Producer

    old = Producer({"bootstrap.servers": bootstrap_servers})
    old.produce(work, key=b"old", value=b"v", partition=0, timestamp=int(time.time() * 1000) - 45_000)
    assert old.flush(15) == 0
    loop.send([share(topic_prefix, work, 0, 1), share(topic_prefix, gone, 0, 3)], topic=work_dlq)
    admin.delete_topics([gone])[gone].result(timeout=15)
    loop.ingest(2)
    check = replace(ONLY, letters_unreadable=0, letter_retention_share=0.5)

    fired = run_monitor(
        database_url, check, alert_notifiers(), letters=lambda store: read_letters(loop.settings, store)
    )
    calm = run_monitor(
        database_url, replace(check, letters_unreadable=5, letter_retention_share=0.9), alert_notifiers(),
        letters=lambda store: read_letters(loop.settings, store),
    )  # fmt: skip

    reading = fired["reading"]
    assert reading["letters_unreadable"] == 1
    assert reading["letters_by_writer"] == {"share": 2}  # letters read per writing tool, the last hour
    assert (reading["letter_topic"], reading["letter_retention_ms"]) == (work, 60_000)
    assert 0.70 <= reading["letter_retention_share"] < 0.95  # 45 s, and the seconds the test took
    assert fired["firing"] == ["letters_near_retention", "letters_unreadable"]
    texts = [post["text"] for post in webhook.delivered()]
    assert any(
        t.startswith(
            "[FIRING] retry_monitor: 1 share-group dead letter(s) of the last hour kept without their record"
        )
        for t in texts
    )
    near = next(t for t in texts if "of its topic's retention old when read" in t)
    assert f"pointing to {work}" in near and "errors.deadletterqueue.copy.record.enable=true" in near
    assert calm["firing"] == []
