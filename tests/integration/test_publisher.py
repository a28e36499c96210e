"""EventPublisher against the session broker, and against no broker at all."""
from __future__ import annotations

import json
import time

import pytest

from cache_core.events import CacheEvent, FeedbackEvent
from cache_core.publish.publisher import EventPublisher
from infra.runtime import free_port
from tests.integration.kafka_helpers import consume, wait_for

pytestmark = pytest.mark.integration



def dead_broker(kafka_settings):
    """The same topics, at a loopback port nobody listens on."""
    return kafka_settings.model_copy(update={"bootstrap_servers": f"127.0.0.1:{free_port()}"})


def event(seq: int, unit: str) -> CacheEvent:
    return CacheEvent(unit_id=unit, instance_id="test", latency_ms=float(seq))


def test_round_trip_keys_and_per_key_order(kafka_settings, tmp_path):
    publisher = EventPublisher(kafka_settings, tmp_path / "spool", instance_id="i1")
    units = [f"unit-{u}" for u in range(5)]
    sent = [event(seq, units[seq % 5]) for seq in range(200)]
    for e in sent:
        publisher.publish_event(e)
    verdicts = [FeedbackEvent(request_id=e.request_id, verdict="correct") for e in sent[:20]]
    for f in verdicts:
        publisher.publish_feedback(f)
    assert publisher.flush(30)
    publisher.close()
    assert publisher.stats()["published"] == 220
    assert publisher.stats()["spooled"] == publisher.stats()["dropped"] == 0

    got = consume(kafka_settings.bootstrap_servers, kafka_settings.events_topic, expected=200)
    assert len(got) == 200
    for unit in units:
        mine = [r for r in got if r.key == unit.encode()]
        # One key -> one partition, in publication order.
        assert len({r.partition for r in mine}) == 1
        seqs = [json.loads(r.value)["latency_ms"] for r in mine]
        assert seqs == [float(s) for s in range(200) if units[s % 5] == unit]
    assert {CacheEvent.model_validate_json(r.value).request_id for r in got} == {e.request_id for e in sent}

    fb = consume(kafka_settings.bootstrap_servers, kafka_settings.feedback_topic, expected=20)
    assert sorted(r.key for r in fb) == sorted(f.request_id.encode() for f in verdicts)


def test_heartbeats_reach_every_events_partition(kafka_settings, tmp_path):
    publisher = EventPublisher(kafka_settings, tmp_path / "spool", instance_id="hb-instance")
    publisher.start_heartbeats(0.2)
    try:
        wait_for(lambda: publisher.stats()["heartbeats"] >= 2 * kafka_settings.events_partitions)
    finally:
        publisher.close()
    beats = consume(kafka_settings.bootstrap_servers, kafka_settings.events_topic, expected=6)
    parsed = [(r.partition, CacheEvent.model_validate_json(r.value)) for r in beats]
    assert all(e.event_type == "heartbeat" and e.instance_id == "hb-instance" for _, e in parsed)
    assert {p for p, _ in parsed} == set(range(kafka_settings.events_partitions))
    assert publisher.stats()["published"] == 0  # heartbeats are counted apart


def test_publish_does_not_block_when_kafka_is_down(kafka_settings, tmp_path):
    publisher = EventPublisher(dead_broker(kafka_settings), tmp_path / "spool", instance_id="i1",
                               send_timeout_s=2)
    try:
        started = time.monotonic()
        for seq in range(300):
            publisher.publish_event(event(seq, "u"))
        assert time.monotonic() - started < 0.5
        wait_for(lambda: publisher.stats()["spooled"] == 300)
        stats = publisher.stats()
        assert stats["published"] == 0 and stats["dropped"] == 0 and stats["spool_bytes"] > 0
        assert not stats["broker_healthy"]
        assert publisher.flush(0.5) is False
    finally:
        publisher.close(timeout_s=0.5)


def test_full_spool_counts_dropped(kafka_settings, tmp_path):
    line_bytes = 900  # roughly one spooled CacheEvent
    publisher = EventPublisher(dead_broker(kafka_settings), tmp_path / "spool", instance_id="i1",
                               max_spool_bytes=20 * line_bytes, send_timeout_s=2)
    try:
        for seq in range(100):
            publisher.publish_event(event(seq, "u"))
        wait_for(lambda: publisher.stats()["spooled"] + publisher.stats()["dropped"] == 100)
        stats = publisher.stats()
        assert 0 < stats["spooled"] < 100 and stats["dropped"] == 100 - stats["spooled"]
        assert stats["spool_bytes"] <= 20 * line_bytes
    finally:
        publisher.close(timeout_s=0.5)


def test_spool_left_by_a_previous_process_is_replayed_first(kafka_settings, tmp_path):
    spool = tmp_path / "spool"
    offline = EventPublisher(dead_broker(kafka_settings), spool, instance_id="i1", send_timeout_s=2)
    for seq in range(30):
        offline.publish_event(event(seq, "same-unit"))
    offline.close(timeout_s=0.5)  # whatever is still queued is spooled on close
    assert offline.stats()["spooled"] == 30

    online = EventPublisher(kafka_settings, spool, instance_id="i1")
    for seq in range(30, 40):
        online.publish_event(event(seq, "same-unit"))
    assert online.flush(30)
    online.close()
    # Newer messages queue behind the old spool, so they may pass through it too.
    assert online.stats()["replayed"] == 30 + online.stats()["spooled"]

    got = consume(kafka_settings.bootstrap_servers, kafka_settings.events_topic, expected=40)
    assert [json.loads(r.value)["latency_ms"] for r in got] == [float(s) for s in range(40)]
