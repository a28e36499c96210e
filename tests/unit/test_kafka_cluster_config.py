"""The Kafka node properties and topic specs behind infra/kafka/cluster.py (no broker started)."""
from __future__ import annotations

from pathlib import Path

import pytest

from cache_core.settings import KafkaSettings
from infra.kafka.broker import NodeSpec, min_insync_replicas, server_properties, write_server_properties
from infra.kafka.cluster import plan, voters
from infra.kafka.topics import topic_specs


def test_single_node_keeps_replication_one(tmp_path):
    props = server_properties(NodeSpec(tmp_path, 9092, 9093))
    assert props["node.id"] == "1" and props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["default.replication.factor"] == props["offsets.topic.replication.factor"] == "1"
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "1"


def test_cluster_nodes_share_voters_and_id_and_replicate_three_ways(tmp_path):
    cluster = plan(tmp_path, nodes=3)
    assert sorted(cluster.nodes) == [1, 2, 3]
    quorum = {n.voters for n in cluster.nodes.values()}
    assert quorum == {voters({i: n.controller_port for i, n in cluster.nodes.items()})}
    assert len(next(iter(quorum)).split(",")) == 3
    assert {n.cluster_id for n in cluster.nodes.values()} == {cluster.cluster_id}
    ports = [p for n in cluster.nodes.values() for p in (n.port, n.controller_port)]
    assert len(set(ports)) == 6
    props = server_properties(cluster.nodes[2])
    assert props["node.id"] == "2" and props["advertised.listeners"] == f"PLAINTEXT://{cluster.nodes[2].bootstrap}"
    assert props["default.replication.factor"] == props["transaction.state.log.replication.factor"] == "3"
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
    assert cluster.bootstrap.count(",") == 2


def test_a_planned_cluster_comes_back_on_the_same_ports_and_id(tmp_path):
    first = plan(tmp_path, nodes=3)
    first.save()
    again = plan(tmp_path, nodes=3)
    assert again.cluster_id == first.cluster_id and again.bootstrap == first.bootstrap
    assert again.nodes[3].voters == first.nodes[3].voters
    with pytest.raises(RuntimeError, match="3 nodes, not 5"):
        plan(tmp_path, nodes=5)


def test_overrides_win_over_the_written_defaults(tmp_path):
    path = write_server_properties(NodeSpec(Path(tmp_path), 9092, 9093),
                                   {"broker.session.timeout.ms": "6000"})
    lines = path.read_text().splitlines()
    assert "broker.session.timeout.ms=6000" in lines


@pytest.mark.parametrize(("rf", "min_isr"), [(1, "1"), (2, "1"), (3, "2"), (5, "2")])
def test_every_topic_gets_min_insync_replicas_for_its_replication(rf, min_isr):
    specs = topic_specs(KafkaSettings(replication_factor=rf))
    assert len(specs) == 4
    for spec in specs.values():
        assert spec["replication_factor"] == rf
        assert spec["configs"]["min.insync.replicas"] == min_isr
    assert min_insync_replicas(rf) == int(min_isr)
