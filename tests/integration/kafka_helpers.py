"""Small readers used by the Kafka integration tests (no consumer group, from the beginning),
and a poll-until helper."""
from __future__ import annotations

import time

from kafka import KafkaConsumer, TopicPartition


def consume(bootstrap: str, topic: str, expected: int, timeout_s: float = 30.0,
            keep=lambda record: True) -> list:
    """Read ``topic`` from the beginning until ``expected`` kept records (or the deadline)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", allow_auto_create_topics=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                out.extend(r for r in records if keep(r))
        # One more short poll: more than expected is a failure the caller should see.
        for records in consumer.poll(timeout_ms=300).values():
            out.extend(r for r in records if keep(r))
        return out
    finally:
        consumer.close()


def wait_for(check, timeout_s: float = 30.0, what: str = "condition") -> None:
    """Poll ``check`` until it is true; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} not met within {timeout_s}s"
        time.sleep(0.05)
