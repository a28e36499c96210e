"""Which managed topic configs ensure_topics sets on an existing topic (no broker needed)."""
from __future__ import annotations

import kafka.errors as Errors
import pytest

from cache_core.settings import KafkaSettings
from infra.kafka.topics import _create_partitions, config_changes, topic_specs


def _described(specs, overrides=None, source="DYNAMIC_TOPIC_CONFIG"):
    """describe_configs(config_filter="all")["topic"] as if every topic had exactly scache's configs."""
    out = {t: {k: {"value": v, "config_source": source} for k, v in spec["configs"].items()}
           for t, spec in specs.items()}
    for topic, configs in (overrides or {}).items():
        out[topic].update(configs)
    return out


def test_topics_as_created_need_no_change():
    specs = topic_specs(KafkaSettings(replication_factor=3))
    assert config_changes(specs, _described(specs)) == {}


def test_old_min_insync_and_wrong_retention_are_set_and_nothing_else():
    kafka = KafkaSettings(replication_factor=3)
    specs = topic_specs(kafka)
    described = _described(specs, {
        kafka.events_topic: {"min.insync.replicas": {"value": "1", "config_source": "DYNAMIC_TOPIC_CONFIG"},
                             "compression.type": {"value": "zstd", "config_source": "DYNAMIC_TOPIC_CONFIG"}},
        kafka.entries_topic: {"retention.ms": {"value": "1000", "config_source": "DYNAMIC_TOPIC_CONFIG"}},
    })
    assert config_changes(specs, described) == {
        kafka.events_topic: {"min.insync.replicas": ("1", "DYNAMIC_TOPIC_CONFIG", "2")},
        kafka.entries_topic: {"retention.ms": ("1000", "DYNAMIC_TOPIC_CONFIG", str(kafka.entries_retention_ms))},
    }


def test_a_value_from_the_broker_is_pinned_on_the_topic_even_when_equal():
    kafka = KafkaSettings(replication_factor=3)
    specs = topic_specs(kafka)
    described = _described(specs, {kafka.feedback_topic: {
        "cleanup.policy": {"value": "delete", "config_source": "DEFAULT_CONFIG"}}})
    del described[kafka.control_topic]["segment.ms"]  # not reported at all
    assert config_changes(specs, described) == {
        kafka.feedback_topic: {"cleanup.policy": ("delete", "DEFAULT_CONFIG", "delete")},
        kafka.control_topic: {"segment.ms": (None, None, "60000")},
    }


class _Admin:
    """create_partitions answering as the controller does."""

    def __init__(self, error: Exception | None = None):
        self.error, self.asked = error, []

    def create_partitions(self, counts: dict) -> None:
        self.asked.append(counts)
        if self.error is not None:
            raise self.error


def test_growing_a_topic_the_controller_has_grown_already_is_not_an_error():
    # Stale metadata (a topic just created on a 3-broker cluster, or grown by another replica's start).
    stale = Errors.InvalidPartitionsError("... error_message='Topic already has 3 partition(s).')")
    assert _create_partitions(_Admin(stale), "t", 3) is False
    assert _create_partitions(_Admin(), "t", 3) is True
    short = Errors.InvalidPartitionsError("... error_message='Topic already has 2 partition(s).')")
    with pytest.raises(Errors.InvalidPartitionsError):
        _create_partitions(_Admin(short), "t", 3)
    with pytest.raises(Errors.InvalidPartitionsError):
        _create_partitions(_Admin(Errors.InvalidPartitionsError("Number of partitions must be larger")), "t", 3)
