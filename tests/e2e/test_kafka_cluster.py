"""The production Kafka shape of infra/deploy/README.md, for real: 3 KRaft brokers, RF 3, min ISR 2.

infra.kafka.cluster starts three broker+controller JVMs on loopback (one quorum, one
cluster id); infra.kafka.topics creates scache's topics with SCACHE_KAFKA__REPLICATION_FACTOR=3.
The cache's EventPublisher then produces a steady stream of decisions while the broker
leading an events partition is SIGKILLed. Production must go on (whatever was spooled
meanwhile replays), a read_committed consumer must see every event exactly once and in
per-key order, the control topic must still bring a config change to a registry with
that broker down, and the restarted broker must rejoin every ISR. The cluster is stopped
at teardown, even on failure.
"""
from __future__ import annotations

import os
import threading
import time
import uuid
from collections import defaultdict

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from cache_core.publish.control_topic import ControlListener, publish_control
from cache_core.events import CacheEvent, ControlMessage
from cache_core.experiments import ArmConfig, ExperimentConfig
from cache_core.publish.publisher import EventPublisher
from cache_core.registry import ExperimentRegistry
from cache_core.settings import KafkaSettings
from infra.kafka.cluster import KafkaCluster, start_cluster
from infra.kafka.topics import admin_client, ensure_topics
from infra.runtime import group_alive

pytestmark = pytest.mark.e2e

NODES = 3
KEYS = 12            # unit ids: several per partition, each with its own order to keep
RATE_PER_S = 200     # a steady stream, well inside what the publisher drains on this machine
BEFORE_KILL_S = 3.0  # stream this long on a healthy cluster first
AFTER_KILL_S = 12.0  # then past the broker session timeout and the failover
FAILOVER_TIMEOUT_S = 45.0
# A crashed broker's partitions move once its broker session times out (Kafka's default 9 s),
# after a controller election first when the active controller dies with it (the case killed
# here: 2-3 s more). That, plus the clients' metadata refresh, must stay inside the publisher's
# 10 s delivery timeout: then the batches in flight at the crash are retried by the same
# idempotent producer (the new leader drops the copies). Past it they expire, are spooled
# and sent again by a fresh producer, and whatever the dead leader had replicated without
# acknowledging is there twice (seen with 6 s: 11 and 6 duplicates in 2 of 3 runs). With 4 s
# the failover took 6.0-6.5 s in five runs; see infra/deploy/README.md.
BROKER_OVERRIDES = {"broker.session.timeout.ms": "4000", "broker.heartbeat.interval.ms": "1000"}
DELIVERY_TIMEOUT_S = 60.0


@pytest.fixture
def kafka_cluster(tmp_path):
    cluster = start_cluster(tmp_path / "kafka-cluster", NODES, overrides=BROKER_OVERRIDES)
    groups = {i: s.proc.pid for i, s in cluster.services.items()}
    try:
        yield cluster
    finally:
        cluster.stop()
        groups.update({i: s.proc.pid for i, s in cluster.services.items()})  # restarted nodes
    assert not [i for i, pgid in groups.items() if group_alive(pgid)], "kafka nodes left after stop"


def _settings(cluster: KafkaCluster) -> KafkaSettings:
    suffix = uuid.uuid4().hex[:8]
    return KafkaSettings(bootstrap_servers=cluster.bootstrap, replication_factor=3,
                         events_topic=f"scache.events.{suffix}", control_topic=f"scache.control.{suffix}",
                         feedback_topic=f"scache.feedback.{suffix}", entries_topic=f"scache.entries.{suffix}",
                         client_id=f"scache-cluster-{suffix}")


def _topic_config(kafka: KafkaSettings, topic: str, key: str) -> str:
    admin = admin_client(kafka)
    try:
        found = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        return found["topic"][topic][key]["value"]
    finally:
        admin.close()


def _config(version: int, threshold: float) -> ControlMessage:
    return ControlMessage(actor="cluster-test", reason=f"v{version}", experiment=ExperimentConfig(
        experiment_id="exp-cluster", salt="salt", version=version, updated_by="cluster-test",
        arms=[ArmConfig(name="control", threshold=threshold), ArmConfig(name="treatment")]))


def _poll(check, timeout_s: float, what: str, interval_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as exc:  # metadata requests fail while a node is going away
            last = exc
        time.sleep(interval_s)
    raise AssertionError(f"{what}: not after {timeout_s:.0f}s (last: {last!r})")


class Stream:
    """Publishes decisions at a steady rate in a thread; request ids carry the key and a per-key
    sequence number, so the consumer can check per-key order. Samples ``published`` as it goes."""

    def __init__(self, publisher: EventPublisher):
        self.publisher = publisher
        self.sent: list[str] = []
        self.samples: list[tuple[float, int]] = []  # (monotonic, stats()["published"])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stream", daemon=True)

    def start(self) -> "Stream":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        seq = defaultdict(int)
        started, n = time.monotonic(), 0
        while not self._stop.is_set():
            key = f"u{n % KEYS}"
            request_id = f"{key}-{seq[key]:06d}"
            seq[key] += 1
            self.publisher.publish_event(CacheEvent(request_id=request_id, unit_id=key,
                                                    experiment_id="exp-cluster", arm="control",
                                                    decision="miss", instance_id="cluster-test"))
            self.sent.append(request_id)
            n += 1
            if n % 20 == 0:
                self.samples.append((time.monotonic(), self.publisher.stats()["published"]))
            # Absolute schedule: a slow moment is caught up, the mean rate stays RATE_PER_S.
            self._stop.wait(max(0.0, started + n / RATE_PER_S - time.monotonic()))

    def longest_stall_s(self) -> float:
        """The longest stretch in which no new event was acknowledged (while the stream ran)."""
        longest, since, last = 0.0, None, -1
        for at, published in self.samples:
            if published != last:
                since, last = at, published
            elif since is not None:
                longest = max(longest, at - since)
        return longest


def _read_all(kafka: KafkaSettings, expected: int, timeout_s: float) -> list[tuple[int, str]]:
    """(partition, request id) of every decision on the events topic, in partition order."""
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, group_id=None,
                             enable_auto_commit=False, isolation_level="read_committed",
                             auto_offset_reset="earliest", request_timeout_ms=10_000)
    try:
        tps = [TopicPartition(kafka.events_topic, p) for p in range(kafka.events_partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        seen: list[tuple[int, str]] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                for record in records:
                    event = CacheEvent.model_validate_json(record.value)
                    if event.event_type == "decision":
                        seen.append((tp.partition, event.request_id))
            if len(seen) >= expected:
                # Anything after the expected count would be a duplicate: one more poll shows it.
                for tp, records in consumer.poll(timeout_ms=1500).items():
                    seen += [(tp.partition, CacheEvent.model_validate_json(r.value).request_id)
                             for r in records]
                return seen
        return seen
    finally:
        consumer.close()


def test_cluster_survives_losing_the_events_leader(kafka_cluster, tmp_path):
    test_started = time.monotonic()
    kafka = _settings(kafka_cluster)
    ensure_topics(kafka)

    # RF 3 on every topic, all replicas in sync, min.insync.replicas 2 (topic-level, from topics.py).
    for topic in (kafka.events_topic, kafka.control_topic, kafka.feedback_topic, kafka.entries_topic):
        parts = kafka_cluster.partitions(topic)
        assert parts and all(len(p["replicas"]) == 3 and len(p["isr"]) == 3 for p in parts.values()), parts
        assert _topic_config(kafka, topic, "min.insync.replicas") == "2"
    # The worst case: the active controller, when it also leads an events partition (it usually
    # does: 3 partitions over 3 brokers). Then a controller election comes before the fencing.
    events_parts = kafka_cluster.partitions(kafka.events_topic)
    controller = kafka_cluster.active_controller()
    leaders = {info["leader"] for info in events_parts.values()}
    victim = controller if controller in leaders else events_parts[0]["leader"]
    led = sorted(p for p, info in events_parts.items() if info["leader"] == victim)

    registry = ExperimentRegistry({"exp-cluster": _config(1, 0.80).experiment})
    listener = ControlListener(kafka, on_record=registry.apply_record).start()
    publisher = EventPublisher(kafka, tmp_path / "spool", instance_id="cluster-test")
    stream = Stream(publisher)
    try:
        assert listener.wait_caught_up(30)
        stream.start()
        time.sleep(BEFORE_KILL_S)
        assert publisher.stats()["published"] > 0, publisher.stats()

        kafka_cluster.kill_node(victim)
        killed_at = time.monotonic()

        # A surviving replica takes over every partition the victim led.
        def new_leaders() -> bool:
            parts = kafka_cluster.partitions(kafka.events_topic)
            return all(parts[p]["leader"] not in (victim, -1) for p in led) and parts
        _poll(new_leaders, FAILOVER_TIMEOUT_S, f"a new leader for partitions {led} after killing node {victim}")
        failover_s = time.monotonic() - killed_at
        parts_down = kafka_cluster.partitions(kafka.events_topic)
        assert all(victim not in p["isr"] and len(p["isr"]) == 2 for p in parts_down.values()), parts_down

        # With the victim still down, a config change reaches the registry through the control topic.
        published_at = time.monotonic()
        publish_control(kafka, _config(2, 0.93), timeout_s=15)
        _poll(lambda: registry.get("exp-cluster").version == 2, 30, "config v2 in the registry")
        control_s = time.monotonic() - published_at
        assert registry.get("exp-cluster").arm("control").threshold == 0.93

        time.sleep(max(0.0, killed_at + AFTER_KILL_S - time.monotonic()))
        stream.stop()
        stats_at_stop = publisher.stats()
        assert publisher.flush(timeout_s=DELIVERY_TIMEOUT_S), publisher.stats()
        stats = publisher.stats()
    finally:
        stream.stop()
        publisher.close()
        listener.stop()

    # Production went on: nothing dropped, the spool (if used) replayed to the last record,
    # and acknowledgements resumed well within the run.
    assert stats["dropped"] == 0 and stats["spool_bytes"] == 0, stats
    assert stats["published"] == len(stream.sent), (stats, len(stream.sent))
    after_kill = [p for at, p in stream.samples if at > killed_at + failover_s + 2.0]
    assert after_kill and after_kill[-1] > after_kill[0], "nothing acknowledged after the failover"

    # Every event exactly once, in per-key order, read with read_committed from the 2 survivors.
    seen = _read_all(kafka, len(stream.sent), DELIVERY_TIMEOUT_S)
    ids = [request_id for _, request_id in seen]
    assert len(ids) == len(stream.sent) and set(ids) == set(stream.sent), \
        (len(ids), len(set(ids)), len(stream.sent), sorted(set(stream.sent) - set(ids))[:5])
    by_key: dict[str, list[str]] = defaultdict(list)
    for _, request_id in seen:
        by_key[request_id.split("-")[0]].append(request_id)
    assert all(order == sorted(order) for order in by_key.values())
    assert len({p for p, request_id in seen if request_id.startswith("u0-")}) == 1  # one key, one partition

    # The killed broker comes back on its ports and rejoins every ISR.
    restarted_at = time.monotonic()
    kafka_cluster.start_node(victim)
    rejoin = lambda: all(len(p["isr"]) == 3 for p in kafka_cluster.partitions(kafka.events_topic).values())  # noqa: E731
    _poll(rejoin, 60, f"node {victim} back in every ISR of {kafka.events_topic}", interval_s=0.5)
    rejoin_s = time.monotonic() - restarted_at
    _poll(lambda: all(len(p["isr"]) == 3 for p in kafka_cluster.partitions(kafka.control_topic).values()),
          30, "control topic ISR back to 3")

    print(f"\nkilled node {victim} (led events partitions {led}; active controller: "
          f"{victim == controller}); new leader after {failover_s:.1f}s; "
          f"longest ack stall {stream.longest_stall_s():.1f}s; config change applied {control_s:.1f}s after "
          f"publish; {len(stream.sent)} events, spooled {stats['spooled']} replayed {stats['replayed']} "
          f"send failures {stats['send_failures']} (at stream stop: published {stats_at_stop['published']}, "
          f"queue {stats_at_stop['queue_depth']}); rejoined ISR {rejoin_s:.1f}s after restart; "
          f"test {time.monotonic() - test_started:.1f}s")


def test_cli_prints_the_bootstrap_list_and_stops_every_node_on_sigterm(tmp_path):
    import signal
    import subprocess
    import sys

    from cache_core.runtime import port_open
    from infra.runtime import REPO_ROOT

    proc = subprocess.Popen([sys.executable, "-m", "infra.kafka.cluster", "--nodes", "3",
                             "--data-dir", str(tmp_path), "--set", "broker.session.timeout.ms=4000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        deadline = time.monotonic() + 180
        line = ""
        while "cluster ready:" not in line and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
        assert "kafka cluster ready: 127.0.0.1:" in line, line
        bootstrap = line.split("ready: ")[1].split()[0]
        ports = [int(server.rsplit(":", 1)[1]) for server in bootstrap.split(",")]
        assert len(set(ports)) == 3 and all(port_open("127.0.0.1", p) for p in ports)
        assert all("broker.session.timeout.ms=4000" in (tmp_path / f"node-{i}" / "server.properties").read_text()
                   for i in (1, 2, 3))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
        assert not any(port_open("127.0.0.1", p) for p in ports)
        for i in (1, 2, 3):
            assert f"[BrokerServer id={i}] shut down completed" in (tmp_path / f"node-{i}" / "broker.log").read_text()
    finally:
        if proc.poll() is None:  # a failed assertion: let the CLI stop its nodes, else kill them here
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                _kill_jvms_under(tmp_path)


def _kill_jvms_under(data_dir) -> None:
    """SIGKILL the node JVMs this test's CLI started (their own process groups), found by data dir."""
    import signal
    from pathlib import Path

    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(data_dir).encode() in cmdline.read_bytes():
                os.killpg(int(cmdline.parent.name), signal.SIGKILL)
        except (OSError, ValueError):
            pass
