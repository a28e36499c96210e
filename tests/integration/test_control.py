"""The control topic: publish, follow, and read back the winning config per experiment."""
from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from cache_core.publish.control_topic import (ControlError, ControlListener, ControlLost, publish_confirmed, publish_control,
                                read_control, read_latest_configs)
from cache_core.events import ControlMessage
from cache_core.experiments import ArmConfig, ExperimentConfig
from cache_core.registry import ExperimentRegistry
from infra.kafka.topics import admin_client
from infra.runtime import free_port
from tests.integration.kafka_helpers import wait_for

pytestmark = pytest.mark.integration


def message(experiment_id: str, version: int, threshold: float = 0.8, actor: str = "test") -> ControlMessage:
    return ControlMessage(actor=actor, reason=f"v{version}", experiment=ExperimentConfig(
        experiment_id=experiment_id, salt="salt", version=version, updated_by=actor,
        arms=[ArmConfig(name="control", threshold=threshold), ArmConfig(name="treatment")]))


def raw_send(kafka, key: bytes, value: bytes | None) -> None:
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
    try:
        producer.send(kafka.control_topic, key=key, value=value).get(timeout=10)
    finally:
        producer.close()



def test_listener_replays_then_follows_and_skips_malformed(kafka_settings):
    publish_control(kafka_settings, message("exp-a", 1))
    received: list[ControlMessage] = []
    listener = ControlListener(kafka_settings, received.append).start()
    try:
        assert listener.wait_caught_up(30)
        assert [m.experiment.version for m in received] == [1]

        raw_send(kafka_settings, b"exp-a", b'{"not": "a control message"')
        raw_send(kafka_settings, b"exp-a", b'{"kind": "experiment", "experiment": {"experiment_id": "x"}}')
        publish_control(kafka_settings, message("exp-a", 2, threshold=0.95))
        wait_for(lambda: len(received) == 2)
        assert received[1].experiment.arm("control").threshold == 0.95
        stats = listener.stats()
        assert stats["malformed"] == 2 and stats["received"] == 4 and stats["alive"]
    finally:
        listener.stop()


def test_handler_errors_are_counted_not_fatal(kafka_settings):
    seen = []

    def flaky(msg: ControlMessage) -> None:
        seen.append(msg.experiment.version)
        if msg.experiment.version == 1:
            raise RuntimeError("handler bug")

    publish_control(kafka_settings, message("exp-b", 1))
    publish_control(kafka_settings, message("exp-b", 2))
    listener = ControlListener(kafka_settings, flaky).start()
    try:
        wait_for(lambda: seen == [1, 2])
        assert listener.stats()["handler_errors"] == 1 and listener.stats()["applied"] == 1
    finally:
        listener.stop()


def test_read_latest_configs_keeps_the_winner_per_experiment(kafka_settings):
    assert read_latest_configs(kafka_settings) == {}
    publish_control(kafka_settings, message("exp-a", 1))
    b1 = publish_control(kafka_settings, message("exp-b", 1))
    a2 = publish_control(kafka_settings, message("exp-a", 2))
    assert a2.key.startswith(b"exp-a/v2/") and a2.offset == b1.offset + 1
    raw_send(kafka_settings, b"exp-a", b"garbage")
    latest = read_latest_configs(kafka_settings)
    assert {k: m.experiment.version for k, m in latest.items()} == {"exp-a": 2, "exp-b": 1}
    raw_send(kafka_settings, b1.key, None)  # tombstone of exp-b's only record removes it
    assert set(read_latest_configs(kafka_settings)) == {"exp-a"}
    # Old-format records (keyed by experiment id) still read, and their tombstone removes them.
    raw_send(kafka_settings, b"exp-old", message("exp-old", 3).model_dump_json().encode())
    assert read_latest_configs(kafka_settings)["exp-old"].experiment.version == 3
    raw_send(kafka_settings, b"exp-old", None)
    assert set(read_latest_configs(kafka_settings)) == {"exp-a"}
    # Read up to a given record: what a publisher does to confirm it won.
    assert read_control(kafka_settings, until=b1).messages()["exp-a"].experiment.version == 1


def test_clear_errors_when_kafka_is_unreachable(kafka_settings):
    down = kafka_settings.model_copy(update={"bootstrap_servers": f"127.0.0.1:{free_port()}"})
    with pytest.raises(ControlError, match="cannot connect"):
        publish_control(down, message("exp-a", 1), timeout_s=2)
    with pytest.raises(ControlError, match="cannot connect"):
        read_latest_configs(down, timeout_s=2)


def test_missing_control_topic_is_a_clear_error(kafka_settings):
    missing = kafka_settings.model_copy(update={"control_topic": kafka_settings.control_topic + ".nope"})
    with pytest.raises(ControlError, match="does not exist"):
        read_latest_configs(missing)


def topic_records(kafka) -> list[tuple[int, bytes]]:
    """(offset, key) of every record left on the control topic."""
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, enable_auto_commit=False,
                             consumer_timeout_ms=2000)
    try:
        tp = TopicPartition(kafka.control_topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        return [(r.offset, r.key) for r in consumer]
    finally:
        consumer.close()


def force_compaction(kafka, gone_offset: int, timeout_s: float = 60) -> None:
    """Roll the active segment (tiny segment.ms, then one more record) and wait until the
    cleaner has removed the record at ``gone_offset`` (a superseded old-format record)."""
    admin = admin_client(kafka)
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, kafka.control_topic,
                                            configs={"segment.ms": "100"})], incremental=True)
    finally:
        admin.close()
    deadline = time.monotonic() + timeout_s
    while gone_offset in [o for o, _ in topic_records(kafka)]:
        assert time.monotonic() < deadline, "the log cleaner did not compact the control topic in time"
        time.sleep(0.2)
        publish_control(kafka, message("filler", 1))  # lands in a new segment: the old one is cleanable


def test_racing_pushes_first_wins_everywhere_and_survives_compaction(kafka_settings):
    running = ExperimentRegistry({})
    listener = ControlListener(kafka_settings, on_record=running.apply_record).start()
    try:
        assert listener.wait_caught_up(30)
        # Before the change the topic was keyed by experiment id: a superseded record to be compacted.
        raw_send(kafka_settings, b"exp-old", message("exp-old", 1).model_dump_json().encode())
        raw_send(kafka_settings, b"exp-old", message("exp-old", 2).model_dump_json().encode())
        # Two publishers both read version 1 and both publish version 2.
        alice = publish_control(kafka_settings, message("exp-r", 2, threshold=0.7, actor="alice"))
        bob = publish_control(kafka_settings, message("exp-r", 2, threshold=0.6, actor="bob"))
        assert alice.key != bob.key and bob.offset == alice.offset + 1
        wait_for(lambda: listener.stats()["received"] >= 4)
        assert running.get("exp-r").updated_by == "alice" and running.get("exp-r").arm("control").threshold == 0.7
        assert read_latest_configs(kafka_settings)["exp-r"].actor == "alice"

        force_compaction(kafka_settings, gone_offset=0)
        keys = [k for _, k in topic_records(kafka_settings)]
        assert b"exp-old" in keys and keys.count(b"exp-old") == 1  # compaction did run
        assert alice.key in keys and bob.key in keys  # both racers kept: the winner survives
        assert running.get("exp-r").updated_by == "alice"
    finally:
        listener.stop()

    started_later = ExperimentRegistry({})
    later = ControlListener(kafka_settings, on_record=started_later.apply_record).start()
    try:
        assert later.wait_caught_up(30)
        assert started_later.get("exp-r").updated_by == "alice"
        assert started_later.get("exp-old").version == 2
    finally:
        later.stop()
    assert read_latest_configs(kafka_settings)["exp-r"].actor == "alice"


def test_publish_confirmed_tells_the_loser_of_a_race(kafka_settings):
    first = publish_control(kafka_settings, message("exp-c", 4, actor="bob"))  # bob got there first
    with pytest.raises(ControlLost, match="by bob at version 4") as lost:
        publish_confirmed(kafka_settings, message("exp-c", 4, actor="alice"))
    assert lost.value.winner.updated_by == "bob"
    assert read_control(kafka_settings).winner("exp-c").key == first.key
    won = publish_confirmed(kafka_settings, message("exp-c", 5, actor="alice"))
    assert read_control(kafka_settings).winner("exp-c").key == won.key
    # A version the experiments file already holds is not won by a record either (ties keep the earlier).
    base = {"exp-f": message("exp-f", 3).experiment}
    with pytest.raises(ControlLost):
        publish_confirmed(kafka_settings, message("exp-f", 3, actor="alice"), base=base)


def test_listener_takes_exactly_one_handler(kafka_settings):
    with pytest.raises(ValueError, match="exactly one"):
        ControlListener(kafka_settings)
    with pytest.raises(ValueError, match="exactly one"):
        ControlListener(kafka_settings, print, on_record=print)
