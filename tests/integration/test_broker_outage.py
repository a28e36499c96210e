"""A broker of its own, stopped and restarted on the same data dir and port: the publisher
spools while it is down and replays in order; the control listener and the entries follower
reconnect, entries stored during the outage reach the other replica, and the attribution
job reads on once the broker is back."""
from __future__ import annotations

import json
import os
import signal
import time
import uuid

import pytest

from cache_core.publish.control_topic import ControlError, ControlListener, publish_control
from cache_core.events import CacheEvent, ControlMessage
from cache_core.experiments import ArmConfig, ExperimentConfig
from cache_core.cache import SemanticCache
from cache_core.publish.publisher import EventPublisher
from cache_core.registry import ExperimentRegistry
from cache_core.state.replication import EntryFollower, share
from cache_core.settings import KafkaSettings
from infra.kafka.broker import start_broker
from infra.kafka.topics import ensure_topics
from infra.runtime import wait_until
from tests.fixtures.flink import FAST_JOB_ENV, job_env
from tests.integration.attribution_data import (
    Heartbeating, expected_windows, heartbeats, make_events, produce, warehouse_windows,
)
from tests.integration.kafka_helpers import consume, wait_for
from tests.unit.cache_core.helpers import TableEmbedder, unit_vec

pytestmark = pytest.mark.integration

FLINK_WINDOW_S = int(FAST_JOB_ENV["SCACHE_FLINK__WINDOW_S"])


class RestartableBroker:
    def __init__(self, data_dir):
        self.data_dir = data_dir
        self.service = start_broker(data_dir, heap="256m")
        self.port = self.service.info["port"]
        self.controller_port = self.service.info["controller_port"]

    def stop(self):
        self.service.stop()

    def restart(self):
        self.service = start_broker(self.data_dir, port=self.port,
                                    controller_port=self.controller_port, heap="256m")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = RestartableBroker(tmp_path_factory.mktemp("kafka-outage"))
    try:
        yield b
    finally:
        b.service.stop()


@pytest.fixture
def settings(broker, request) -> KafkaSettings:
    name = request.node.name.replace("_", "-")[:40]
    kafka = KafkaSettings(bootstrap_servers=broker.service.info["bootstrap"],
                          events_topic=f"ev.{name}", control_topic=f"ct.{name}",
                          feedback_topic=f"fb.{name}", entries_topic=f"en.{name}")
    ensure_topics(kafka)
    return kafka



def test_spooled_while_down_then_replayed_in_order(broker, settings, tmp_path):
    publisher = EventPublisher(settings, tmp_path / "spool", instance_id="i1", send_timeout_s=3)
    seq = iter(range(10_000))

    def publish(n):
        for _ in range(n):
            publisher.publish_event(CacheEvent(unit_id="one-unit", latency_ms=float(next(seq))))

    try:
        publish(50)
        assert publisher.flush(30)
        broker.stop()
        publish(100)
        wait_for(lambda: publisher.stats()["spooled"] == 100, timeout_s=60)
        assert publisher.stats()["published"] == 50 and publisher.stats()["spool_bytes"] > 0

        broker.restart()
        publish(50)  # newer messages must queue behind the spooled ones
        assert publisher.flush(60)
        stats = publisher.stats()
    finally:
        publisher.close()
    assert stats["published"] == 200 and stats["dropped"] == 0 and stats["spool_bytes"] == 0
    assert stats["replayed"] == stats["spooled"] >= 100

    got = consume(settings.bootstrap_servers, settings.events_topic, expected=200, timeout_s=30)
    assert [json.loads(r.value)["latency_ms"] for r in got] == [float(s) for s in range(200)]


def test_a_stalled_broker_gets_the_queue_spilled_to_the_spool_not_dropped(broker, settings, tmp_path):
    """SIGSTOP: connections stay open and sends hang (as while a leader fails over) instead of
    failing. With a queue of 200 and 600 events offered during a 3 s stall, the drain thread
    spills the queue to the spool while it waits for acks; nothing is dropped, order is kept."""
    publisher = EventPublisher(settings, tmp_path / "spool", instance_id="i1", queue_size=200, send_timeout_s=9)
    seq = iter(range(10_000))

    def publish(n):
        for _ in range(n):
            publisher.publish_event(CacheEvent(unit_id="one-unit", latency_ms=float(next(seq))))

    publish(20)
    assert publisher.flush(30)
    os.killpg(broker.service.proc.pid, signal.SIGSTOP)
    try:
        for _ in range(20):  # 200 events/s for 3 s, the queue holds one second
            publish(30)
            time.sleep(0.15)
        during = publisher.stats()
    finally:
        os.killpg(broker.service.proc.pid, signal.SIGCONT)
    assert publisher.flush(60)
    stats = publisher.stats()
    publisher.close()
    assert during["spilled"] > 0 and during["dropped"] == 0, during
    assert stats["dropped"] == stats["reordered"] == 0 and stats["published"] == 620, stats
    got = consume(settings.bootstrap_servers, settings.events_topic, expected=620, timeout_s=30)
    assert [json.loads(r.value)["latency_ms"] for r in got] == [float(s) for s in range(620)]


def test_a_stall_longer_than_the_send_timeout_loses_nothing_though_order_may_bend(broker, settings, tmp_path):
    """The stalled batch times out after the queue was spilled: it is spooled behind the spilled
    events (counted as reordered) and every event still arrives."""
    publisher = EventPublisher(settings, tmp_path / "spool", instance_id="i1", queue_size=200, send_timeout_s=2)
    sent = [CacheEvent(unit_id=f"unit-{n % 7}", latency_ms=float(n)) for n in range(420)]
    publisher.publish_event(sent[0])
    assert publisher.flush(30)
    os.killpg(broker.service.proc.pid, signal.SIGSTOP)
    try:
        for n in range(1, 420, 30):  # 200 events/s for 2 s; then the stall outlasts the 2 s send timeout
            for e in sent[n:n + 30]:
                publisher.publish_event(e)
            time.sleep(0.15)
        wait_for(lambda: publisher.stats()["send_failures"] > 0, 30, "the stalled batch timing out")
    finally:
        os.killpg(broker.service.proc.pid, signal.SIGCONT)
    assert publisher.flush(60)
    stats = publisher.stats()
    publisher.close()
    assert stats["dropped"] == 0 and stats["spilled"] > 0 and stats["reordered"] > 0, stats
    got = consume(settings.bootstrap_servers, settings.events_topic, expected=420, timeout_s=30)
    assert {CacheEvent.model_validate_json(r.value).request_id for r in got} == {e.request_id for e in sent}


def _message(version: int) -> ControlMessage:
    return ControlMessage(actor="test", experiment=ExperimentConfig(
        experiment_id="exp-outage", salt="s", version=version,
        arms=[ArmConfig(name="a", threshold=0.5 + version / 100)]))


def test_control_listener_survives_broker_down_at_start(broker, settings):
    publish_control(settings, _message(1))
    broker.stop()
    try:
        with pytest.raises(ControlError, match="exp-outage|cannot connect"):
            publish_control(settings, _message(2), timeout_s=2)
        received: list[ControlMessage] = []
        listener = ControlListener(settings, received.append, retry_s=0.5).start()
        time.sleep(0.5)  # let it fail to connect at least once (no assertion depends on timing)
    finally:
        broker.restart()
    try:
        publish_control(settings, _message(3))
        wait_for(lambda: [m.experiment.version for m in received] == [1, 3], timeout_s=60)
        assert listener.stats()["caught_up"]
    finally:
        listener.stop()


def test_heartbeats_resume_after_an_outage_with_no_traffic(broker, settings, tmp_path):
    publisher = EventPublisher(settings, tmp_path / "spool", instance_id="quiet", send_timeout_s=2)
    publisher.start_heartbeats(0.2)
    try:
        wait_for(lambda: publisher.stats()["heartbeats"] >= 3, timeout_s=60)
        broker.stop()
        wait_for(lambda: not publisher.stats()["broker_healthy"], timeout_s=60)
        before = publisher.stats()["heartbeats"]
        broker.restart()
        wait_for(lambda: publisher.stats()["heartbeats"] >= before + 3 * settings.events_partitions, timeout_s=60)
        stats = publisher.stats()
    finally:
        publisher.close()
    assert stats["broker_healthy"] and stats["spooled"] == 0 and stats["published"] == 0


def test_entries_stored_while_the_broker_is_down_reach_the_other_replica(broker, settings, tmp_path):
    experiment = ExperimentConfig(experiment_id="outage", salt="s", arms=[ArmConfig(name="a", threshold=0.9)])
    embedder = TableEmbedder({text: unit_vec(*([0.0] * i + [1.0])) for i, text in enumerate(["x", "y", "z"])})
    replicas = []
    for name in ("one", "two"):
        cache = SemanticCache(embedder, ExperimentRegistry({"outage": experiment}), instance_id=name)
        publisher = EventPublisher(settings, spool_dir=tmp_path / f"spool-{name}", instance_id=name)
        share(cache, publisher, name, "table")
        follower = EntryFollower(settings, cache, name, "table", retry_s=0.5).start()
        replicas.append((cache, publisher, follower))
    (one, one_publisher, _), (two, _, two_follower) = replicas
    try:
        assert two_follower.wait_caught_up(30)
        one.store("x", "X", "unit")
        wait_for(lambda: two_follower.stats()["applied"] == 1, timeout_s=30)
        broker.stop()
        try:
            assert one.store("y", "Y", "unit").stored and one.store("z", "Z", "unit").stored  # served locally
            wait_for(lambda: one_publisher.stats()["spooled"] >= 2, timeout_s=60)
        finally:
            broker.restart()
        wait_for(lambda: two_follower.stats()["applied"] == 3, timeout_s=90)
        assert two.lookup("z", "unit").answer == "Z"
        # the consumer rode out the outage (with or without a reconnect of the loop); the puts came from the spool
        # (counted once the spool's cursor is saved, which may come after the other replica applied them)
        wait_for(lambda: one_publisher.stats()["replayed"] >= 2, timeout_s=30)
        assert one_publisher.stats()["dropped"] == 0
    finally:
        for _, publisher, follower in replicas:
            follower.stop()
            publisher.close()


def test_attribution_job_resumes_after_the_broker_restarts(broker, settings, ch_settings, ch_client,
                                                           flink_job_factory):
    """The Flink Kafka source loses its broker mid-stream: once it is back, the job reads on
    from its offsets, and every window counts each event exactly once."""
    job = flink_job_factory(job_env(settings, ch_settings))
    suffix = f"-{uuid.uuid4().hex[:8]}"
    events = make_events(int(time.time() * 1000) - 60_000, FLINK_WINDOW_S, n=180, seed=13, suffix=suffix)
    half, ids = len(events) // 2, [e.request_id for e in events]

    def raw_count(wanted: list[str]) -> int:
        return ch_client.query("SELECT count() FROM events_raw FINAL WHERE request_id IN {v:Array(String)}",
                               parameters={"v": wanted}).result_rows[0][0]

    produce(settings.bootstrap_servers, settings.events_topic, events[:half])
    wait_until(lambda: raw_count(ids[:half]) == half, 180, "first half in events_raw",
               proc=job.proc, log_path=job.log_path)
    broker.stop()
    time.sleep(10)  # the source's fetches and the checkpoints' offset commits fail meanwhile
    assert job.proc.poll() is None, "the job died with the broker: " + job.log_path.read_text()[-3000:]
    broker.restart()
    closing = heartbeats(events[0].ts_ms + (2 * FLINK_WINDOW_S + 10) * 1000, settings.events_partitions)
    produce(settings.bootstrap_servers, settings.events_topic, events[half:], closing)
    experiment_ids = sorted({e.experiment_id for e in events})
    beat = Heartbeating(settings.bootstrap_servers, settings.events_topic, settings.events_partitions,
                        closing[0][1].ts_ms)
    expected = expected_windows(events, FLINK_WINDOW_S)
    wait_until(lambda: (beat(), warehouse_windows(ch_client, experiment_ids))[1] == expected,
               180, "window_agg after the broker restart", interval_s=1.0, proc=job.proc, log_path=job.log_path)
    # The raw sink flushes on its own processing-time batches: it may land after the windows.
    wait_until(lambda: raw_count(ids) == len(ids), 60, "every event in events_raw",
               proc=job.proc, log_path=job.log_path)
    assert raw_count(ids) == len(ids)
