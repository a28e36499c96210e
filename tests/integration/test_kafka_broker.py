"""The embedded broker and the topics scache creates on it."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from kafka import KafkaConsumer
from kafka.admin import ConfigResource, ConfigResourceType

from infra.kafka.topics import _reconcile_configs, admin_client, ensure_topics, topic_specs
from cache_core.runtime import port_open
from infra.runtime import REPO_ROOT
from tests.integration.kafka_helpers import wait_for

pytestmark = pytest.mark.integration


def _partitions(kafka) -> dict[str, int]:
    admin = admin_client(kafka)
    try:
        return {t["name"]: len(t["partitions"]) for t in admin.describe_topics(
            [kafka.events_topic, kafka.control_topic, kafka.feedback_topic])}
    finally:
        admin.close()


def _configs(kafka, topic: str) -> dict[str, str]:
    admin = admin_client(kafka)
    try:
        found = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        return {k: v["value"] for k, v in found["topic"][topic].items()}
    finally:
        admin.close()


def test_broker_serves_on_loopback(kafka_broker):
    host, port = kafka_broker.info["bootstrap"].split(":")
    assert host == "127.0.0.1" and port_open(host, int(port))
    assert kafka_broker.alive()


def test_topics_have_configured_partitions(kafka_settings):
    assert _partitions(kafka_settings) == {
        kafka_settings.events_topic: kafka_settings.events_partitions,
        kafka_settings.control_topic: 1,
        kafka_settings.feedback_topic: kafka_settings.feedback_partitions,
    }


def test_control_topic_is_compacted_and_events_are_retained(kafka_settings):
    control = _configs(kafka_settings, kafka_settings.control_topic)
    assert control["cleanup.policy"] == "compact"
    assert float(control["min.cleanable.dirty.ratio"]) <= 0.1
    events = _configs(kafka_settings, kafka_settings.events_topic)
    assert events["retention.ms"] == str(kafka_settings.events_retention_ms)
    assert events.get("cleanup.policy", "delete") == "delete"


def test_ensure_topics_is_idempotent_and_grows_partitions(kafka_settings):
    ensure_topics(kafka_settings)
    grown = kafka_settings.model_copy(update={"events_partitions": kafka_settings.events_partitions + 1})
    ensure_topics(grown)
    assert _partitions(grown)[grown.events_topic] == kafka_settings.events_partitions + 1


def _fresh_settings(kafka_settings):
    suffix = uuid.uuid4().hex[:10]
    return kafka_settings.model_copy(update={
        "events_topic": f"scache.events.{suffix}", "control_topic": f"scache.control.{suffix}",
        "feedback_topic": f"scache.feedback.{suffix}", "entries_topic": f"scache.entries.{suffix}"})


def test_ensure_topics_fixes_managed_configs_of_existing_topics_and_keeps_others(kafka_settings, caplog):
    kafka = _fresh_settings(kafka_settings)
    specs = topic_specs(kafka)
    # As an older version (or an operator) left them: events with a wrong retention and no
    # topic-level min.insync.replicas, plus a config scache does not manage.
    old_events = {"retention.ms": "3600000", "cleanup.policy": "delete", "compression.type": "zstd"}
    admin = admin_client(kafka)
    try:
        result = admin.create_topics({kafka.events_topic: {**specs[kafka.events_topic], "configs": old_events}},
                                     raise_errors=False)
        assert result["topics"][0]["error_code"] == 0, result
        admin.wait_for_topics([kafka.events_topic], timeout_ms=30_000)
    finally:
        admin.close()
    assert _configs(kafka, kafka.events_topic)["retention.ms"] == "3600000"

    with caplog.at_level(logging.INFO, logger="infra.kafka.topics"):
        ensure_topics(kafka)
    events = _configs(kafka, kafka.events_topic)
    assert events["retention.ms"] == str(kafka.events_retention_ms)
    assert events["min.insync.replicas"] == "1"
    assert events["compression.type"] == "zstd"  # the operator's, untouched
    for topic, spec in specs.items():
        have = _configs(kafka, topic)
        assert {k: have.get(k) for k in spec["configs"]} == spec["configs"], topic
    changed = {(r.topic, r.config): (r.old, r.new) for r in caplog.records if r.msg == "changing topic config"}
    assert changed[(kafka.events_topic, "retention.ms")] == ("3600000", str(kafka.events_retention_ms))
    assert changed[(kafka.events_topic, "min.insync.replicas")] == ("1", "1")  # pinned on the topic
    assert (kafka.events_topic, "cleanup.policy") not in changed  # already set on the topic

    # Reconciled: a second run changes nothing.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="infra.kafka.topics"):
        ensure_topics(kafka)
    assert not [r for r in caplog.records if r.msg == "changing topic config"]
    assert _configs(kafka, kafka.events_topic)["compression.type"] == "zstd"



def test_the_legacy_alter_configs_path_also_keeps_an_operators_configs(kafka_settings):
    """On a broker without IncrementalAlterConfigs (before Kafka 2.3) the whole topic config is
    replaced: the managed keys are set and the operator's compression.type must survive it."""
    kafka = _fresh_settings(kafka_settings)
    spec = topic_specs(kafka)[kafka.events_topic]
    admin = admin_client(kafka)
    try:
        old = {"retention.ms": "3600000", "compression.type": "zstd"}
        admin.create_topics({kafka.events_topic: {**spec, "configs": old}}, raise_errors=False)
        admin.wait_for_topics([kafka.events_topic], timeout_ms=30_000)
        _reconcile_configs(admin, {kafka.events_topic: spec}, incremental=False)
    finally:
        admin.close()
    want = {**spec["configs"], "compression.type": "zstd"}
    # The broker applies a config change a moment after it answers.
    wait_for(lambda: {k: _configs(kafka, kafka.events_topic).get(k) for k in want} == want, 30,
             f"{kafka.events_topic} configs {want}")


def test_ensure_topics_warns_on_a_replication_factor_it_does_not_change(kafka_settings, caplog):
    # The topics exist at RF 1; asked for RF 2 (which one broker could not even create),
    # ensure_topics leaves them be and says so.
    wanted = kafka_settings.model_copy(update={"replication_factor": 2})
    with caplog.at_level(logging.WARNING, logger="infra.kafka.topics"):
        ensure_topics(wanted)
    warned = {r.topic: (r.have, r.want) for r in caplog.records if "replication factor" in r.msg}
    assert warned == {t: ([1], 2) for t in topic_specs(wanted)}

def test_broker_does_not_auto_create_topics(kafka_settings):
    consumer = KafkaConsumer(bootstrap_servers=kafka_settings.bootstrap_servers, group_id=None,
                             allow_auto_create_topics=True)
    try:
        assert not consumer.partitions_for_topic(kafka_settings.events_topic + ".typo")
    finally:
        consumer.close()
    admin = admin_client(kafka_settings)
    try:
        assert kafka_settings.events_topic + ".typo" not in admin.list_topics()
    finally:
        admin.close()


def test_cli_runs_in_foreground_and_stops_cleanly_on_sigterm(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "infra.kafka.broker", "--data-dir", str(tmp_path),
                             "--heap", "256m"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        line = ""
        while "ready at" not in line and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
        assert "ready at 127.0.0.1:" in line, line
        port = int(line.split("ready at 127.0.0.1:")[1].split()[0])
        assert port_open("127.0.0.1", port)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert not port_open("127.0.0.1", port)
        assert "[BrokerServer id=1] shut down completed" in (tmp_path / "broker.log").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_cli_reports_a_bad_data_dir_without_traceback(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = subprocess.run([sys.executable, "-m", "infra.kafka.broker", "--data-dir", str(blocker)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                          timeout=60)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "error:" in done.stderr
