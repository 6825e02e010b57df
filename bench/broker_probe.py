"""The embedded broker alone: does its CPU per record grow with what it holds? (``soak_p99_drift``)

A private dev broker (Apache Kafka 4.4) on a free port, one topic of four partitions, a producer sending
``--rate`` records a second as the soak's workload does (a tick every 0.1 s), and, unless
``--consumer none``, one consumer following it (``ours``: the ingest consumer's fetch settings;
``batched``: ``fetch.min.bytes`` 64 KiB and ``fetch.wait.max.ms`` 100, fewer and larger fetches).
Every 30 s it prints the broker's CPU in core-milliseconds per 1 000 records sent in that window;
the last line is the whole run as JSON. Nothing of the service runs::

    .venv/bin/python -m bench.broker_probe --consumer ours --seconds 300
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

#: The ingest consumer's fetch settings (``retry_scheduler.loops.kafka.consumer_config``).
CONSUMERS: dict[str, dict[str, Any] | None] = {
    "ours": {"queued.max.messages.kbytes": 1024, "max.partition.fetch.bytes": 262_144, "fetch.queue.backoff.ms": 20},
    "batched": {
        "queued.max.messages.kbytes": 1024, "max.partition.fetch.bytes": 262_144, "fetch.queue.backoff.ms": 20,
        "fetch.min.bytes": 65_536, "fetch.wait.max.ms": 100,
    },
    "none": None,
}  # fmt: skip
WINDOW_S = 30


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def probe(consumer: str, seconds: int, rate: int) -> dict[str, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from retry_scheduler.dev.broker import start_broker
    from retry_scheduler.dev.procs import free_port, terminate

    port = free_port()
    broker = start_broker(
        port, log_path=Path(tempfile.gettempdir()) / f"broker-probe-{port}.log", say=lambda _: None
    )
    assert broker is not None
    bootstrap = f"127.0.0.1:{port}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("probe", 4, 1)])["probe"].result(timeout=15)
    stop, sent, got = threading.Event(), [0], [0]

    def produce() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
        began, ticks = time.monotonic(), 0
        while not stop.is_set():
            for _ in range(rate // 10):
                producer.produce("probe", key=b"k%d" % sent[0], value=b'{"bench": "lateness"}' * 2)
                sent[0] += 1
            producer.poll(0)
            ticks += 1
            time.sleep(max(0.0, began + ticks * 0.1 - time.monotonic()))
        producer.flush(30)

    def consume(settings: dict[str, Any]) -> None:
        reader = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "probe", "auto.offset.reset": "earliest", **settings}
        )
        # Assigned, not subscribed: it reads from the first record, without waiting for a group to form.
        reader.assign([TopicPartition("probe", p, OFFSET_BEGINNING) for p in range(4)])
        while not stop.is_set():
            got[0] += len(reader.consume(1000, 0.2))
        reader.close()

    threads = [threading.Thread(target=produce)]
    if CONSUMERS[consumer] is not None:
        threads.append(threading.Thread(target=consume, args=(CONSUMERS[consumer],)))
    for thread in threads:
        thread.start()
    windows: list[float] = []
    try:
        last_cpu, last_sent, began = cpu_seconds(broker.pid), 0, time.monotonic()
        while time.monotonic() - began < seconds:
            time.sleep(WINDOW_S)
            now_cpu, now_sent = cpu_seconds(broker.pid), sent[0]
            windows.append(round(1e6 * (now_cpu - last_cpu) / max(1, now_sent - last_sent), 1))
            print(
                f"{len(windows) * WINDOW_S:>5} s: broker {windows[-1]} core-ms per 1 000 records", flush=True
            )
            last_cpu, last_sent = now_cpu, now_sent
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        terminate(broker, "broker", timeout=5)
    return {
        "consumer": consumer, "rate_per_s": rate, "seconds": seconds, "sent": sent[0], "consumed": got[0],
        "broker_core_ms_per_1000_by_30s": windows,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.broker_probe", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--consumer", choices=sorted(CONSUMERS), default="ours", help="who reads the topic")
    parser.add_argument("--seconds", type=int, default=300, help="how long (300)")
    parser.add_argument("--rate", type=int, default=5000, help="records a second (5000, the soak's)")
    args = parser.parse_args()
    print(json.dumps(probe(args.consumer, args.seconds, args.rate)))


if __name__ == "__main__":
    main()
