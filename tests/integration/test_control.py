"""The control topic: publish, follow, and read back the latest config per experiment."""
from __future__ import annotations

import time

import pytest
from kafka import KafkaProducer

from cache_core.control import ControlError, ControlListener, publish_control, read_latest_configs
from cache_core.events import ControlMessage
from cache_core.experiments import ArmConfig, ExperimentConfig
from infra.runtime import free_port

pytestmark = pytest.mark.integration


def message(experiment_id: str, version: int, threshold: float = 0.8) -> ControlMessage:
    return ControlMessage(actor="test", reason=f"v{version}", experiment=ExperimentConfig(
        experiment_id=experiment_id, salt="salt", version=version,
        arms=[ArmConfig(name="control", threshold=threshold), ArmConfig(name="treatment")]))


def raw_send(kafka, key: bytes, value: bytes | None) -> None:
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
    try:
        producer.send(kafka.control_topic, key=key, value=value).get(timeout=10)
    finally:
        producer.close()


def wait_for(check, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


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


def test_read_latest_configs_keeps_the_last_per_experiment(kafka_settings):
    assert read_latest_configs(kafka_settings) == {}
    publish_control(kafka_settings, message("exp-a", 1))
    publish_control(kafka_settings, message("exp-b", 1))
    publish_control(kafka_settings, message("exp-a", 2))
    raw_send(kafka_settings, b"exp-a", b"garbage")
    latest = read_latest_configs(kafka_settings)
    assert {k: m.experiment.version for k, m in latest.items()} == {"exp-a": 2, "exp-b": 1}
    raw_send(kafka_settings, b"exp-b", None)  # tombstone removes an experiment
    assert set(read_latest_configs(kafka_settings)) == {"exp-a"}


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
