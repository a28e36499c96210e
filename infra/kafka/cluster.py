"""A KRaft Kafka cluster of N nodes on loopback: the production shape of infra/deploy/README.md.

Every node runs broker and controller in one JVM (infra/kafka/broker.py's ``spawn_node``),
the N controllers form one quorum of N voters, and every storage is formatted with one
cluster id. Topics created without a replication factor get min(N, 3), internal topics
too, and min.insync.replicas is 2 from RF 3 on. State lives under ``data_dir``:
``node-<id>/`` per node and ``cluster.json`` (cluster id and every node's ports), so
starting again on the same directory brings back the same cluster on the same ports
(the voters' addresses are part of the configuration and cannot move).

    python -m infra.kafka.cluster --nodes 3 --data-dir DIR   # prints the bootstrap list, Ctrl-C stops all
    python -m infra.kafka.cluster --data-dir DIR --set broker.session.timeout.ms=4000

Kafka's own defaults otherwise: a SIGKILLed broker's partitions move after its broker
session times out (``broker.session.timeout.ms``, 9 s); see infra/deploy/README.md for why
scache's deployments shorten it.

Tests start, stop, SIGKILL and restart single nodes through ``KafkaCluster``.
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from infra.kafka.broker import HOST, START_TIMEOUT_S, NodeSpec, new_cluster_id, spawn_node, wait_node_ready
from cache_core.runtime import port_open
from infra.runtime import Service, free_port

log = logging.getLogger("scache.kafka.cluster")

STATE_FILE = "cluster.json"
DEFAULT_HEAP = "256m"  # 3 JVMs on a shared 2-core machine; loopback traffic needs little


@dataclass
class KafkaCluster:
    """N nodes from one ``data_dir``; ``stop()`` ends every node this process started."""

    data_dir: Path
    cluster_id: str
    nodes: dict[int, NodeSpec]
    heap: str = DEFAULT_HEAP
    overrides: dict[str, str] = field(default_factory=dict)
    """Extra server properties for every node (e.g. a shorter broker.session.timeout.ms)."""
    services: dict[int, Service] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        """Every node's listener, comma-separated: what SCACHE_KAFKA__BOOTSTRAP_SERVERS takes."""
        return ",".join(node.bootstrap for node in self.nodes.values())

    @property
    def replication(self) -> int:
        return next(iter(self.nodes.values())).replication

    def alive(self, node_id: int) -> bool:
        service = self.services.get(node_id)
        return service is not None and service.alive()

    def running(self) -> list[int]:
        return [node_id for node_id in self.nodes if self.alive(node_id)]

    # -- single nodes ---------------------------------------------------------------------
    def start_node(self, node_id: int, wait: bool = True, timeout_s: float = START_TIMEOUT_S) -> Service:
        """Start one node (again) on its own ports; with ``wait``, until the cluster lists it."""
        if self.alive(node_id):
            raise RuntimeError(f"kafka node {node_id} is already running")
        node = self.nodes[node_id]
        for port in (node.port, node.controller_port):
            if port_open(HOST, port):
                raise RuntimeError(f"kafka node {node_id}: port {port} is taken by another process")
        service = spawn_node(node, heap=self.heap, overrides=self.overrides)
        self.services[node_id] = service
        if wait:
            self.wait_node(node_id, timeout_s)
        return service

    def wait_node(self, node_id: int, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until the node answers and the cluster's metadata lists it as a broker (registered
        and unfenced: a node that answers may still be catching up on the metadata log)."""
        wait_node_ready(self.services[node_id], timeout_s,
                        ready=lambda bootstrap: node_id in self.broker_ids(bootstrap))

    def stop_node(self, node_id: int, timeout_s: float = 30.0) -> None:
        """SIGTERM: a controlled shutdown (leadership moves away first)."""
        service = self.services.get(node_id)
        if service is not None:
            service.stop(timeout_s)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL: a crash; the others notice only when its broker session times out."""
        service = self.services.get(node_id)
        if service is not None:
            service.kill()
            log.info("kafka node killed", extra={"node_id": node_id, "pid": service.proc.pid})

    def stop(self) -> None:
        """Stop every node, all at once (a lone survivor would wait for a quorum that is gone)."""
        with ThreadPoolExecutor(max_workers=max(1, len(self.services))) as pool:
            list(pool.map(lambda s: s.stop(), self.services.values()))

    # -- metadata -------------------------------------------------------------------------
    def _admin(self, bootstrap: str | None = None, timeout_s: float = 5.0):
        from kafka.admin import KafkaAdminClient

        ms = int(timeout_s * 1000)
        return KafkaAdminClient(bootstrap_servers=bootstrap or self._live_bootstrap(),
                                client_id="scache-cluster", request_timeout_ms=ms, bootstrap_timeout_ms=ms)

    def _live_bootstrap(self) -> str:
        live = [self.nodes[i].bootstrap for i in self.running()]
        return ",".join(live) or self.bootstrap

    def broker_ids(self, bootstrap: str | None = None) -> set[int]:
        """The brokers the cluster's metadata lists (registered, unfenced)."""
        admin = self._admin(bootstrap)
        try:
            return {b["broker_id"] for b in admin.describe_cluster()["brokers"]}
        finally:
            admin.close()

    def active_controller(self) -> int:
        """The node leading the KRaft quorum (the active controller); -1 during an election."""
        admin = self._admin()
        try:
            quorum = admin.describe_metadata_quorum()
        finally:
            admin.close()
        return quorum["topics"][0]["partitions"][0]["leader_id"]

    def partitions(self, topic: str) -> dict[int, dict]:
        """partition -> {"leader": id (-1 if none), "replicas": [ids], "isr": [ids]}."""
        admin = self._admin()
        try:
            described = admin.describe_topics([topic])
        finally:
            admin.close()
        return {p["partition_index"]: {"leader": p["leader_id"], "replicas": list(p["replica_nodes"]),
                                       "isr": list(p["isr_nodes"])}
                for t in described for p in t["partitions"]}

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until every running node is listed by the cluster's metadata."""
        deadline = time.monotonic() + timeout_s
        for node_id in self.running():
            self.wait_node(node_id, max(1.0, deadline - time.monotonic()))

    # -- state ----------------------------------------------------------------------------
    def save(self) -> None:
        (self.data_dir / STATE_FILE).write_text(json.dumps({
            "cluster_id": self.cluster_id, "replication": self.replication,
            "nodes": {str(i): {"port": n.port, "controller_port": n.controller_port}
                      for i, n in self.nodes.items()}}, indent=1))


def voters(ports: dict[int, int]) -> str:
    """``controller.quorum.voters`` from node id -> controller port."""
    return ",".join(f"{node_id}@{HOST}:{port}" for node_id, port in sorted(ports.items()))


def plan(data_dir: Path, nodes: int = 3) -> KafkaCluster:
    """The cluster of ``data_dir``: the remembered one (same id, same ports), or a new one on
    free ports. Nothing is started."""
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    state_path = data_dir / STATE_FILE
    if state_path.exists():
        state = json.loads(state_path.read_text())
        if len(state["nodes"]) != nodes:
            raise RuntimeError(f"{data_dir} holds a cluster of {len(state['nodes'])} nodes, not {nodes}; "
                               "use another --data-dir")
        cluster_id = state["cluster_id"]
        ports = {int(i): (p["port"], p["controller_port"]) for i, p in state["nodes"].items()}
    else:
        cluster_id = new_cluster_id()
        ports = {i: (free_port(HOST), free_port(HOST)) for i in range(1, nodes + 1)}
    quorum = voters({i: ctl for i, (_, ctl) in ports.items()})
    replication = min(nodes, 3)
    specs = {i: NodeSpec(data_dir / f"node-{i}", port, ctl, node_id=i, voters=quorum,
                         cluster_id=cluster_id, replication=replication)
             for i, (port, ctl) in ports.items()}
    return KafkaCluster(data_dir=data_dir, cluster_id=cluster_id, nodes=specs)


def start_cluster(data_dir: Path, nodes: int = 3, heap: str = DEFAULT_HEAP,
                  overrides: dict[str, str] | None = None, timeout_s: float = START_TIMEOUT_S) -> KafkaCluster:
    """Start every node and wait until the cluster lists all of them; on failure none is left running."""
    if nodes < 1:
        raise ValueError(f"a cluster needs at least one node, got {nodes}")
    cluster = plan(data_dir, nodes)
    cluster.heap, cluster.overrides = heap, dict(overrides or {})
    started = time.monotonic()
    try:
        # Formatting is a JVM per node: in parallel. No node answers before a majority runs.
        with ThreadPoolExecutor(max_workers=nodes) as pool:
            list(pool.map(lambda i: cluster.start_node(i, wait=False), cluster.nodes))
        cluster.save()
        cluster.wait_ready(timeout_s)
    except BaseException:
        cluster.stop()
        raise
    log.info("kafka cluster ready", extra={"bootstrap": cluster.bootstrap, "nodes": nodes,
                                           "start_s": round(time.monotonic() - started, 1)})
    return cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.kafka.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--heap", default=DEFAULT_HEAP, help="per node (default %(default)s)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra server property for every node, e.g. broker.session.timeout.ms=4000")
    args = parser.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.set if "=" in item)
    if len(overrides) != len(args.set):
        parser.error("--set takes KEY=VALUE")
    from cache_core.logs import configure_logging
    configure_logging()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        cluster = start_cluster(args.data_dir, args.nodes, args.heap, overrides)
    except (RuntimeError, OSError, ValueError) as exc:  # TimeoutError is an OSError
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"kafka cluster ready: {cluster.bootstrap} (id {cluster.cluster_id}, {args.nodes} nodes, "
          f"replication {cluster.replication}; logs {cluster.data_dir}/node-*/broker.log)", flush=True)
    try:
        while not stop.wait(1.0):
            dead = [i for i in cluster.nodes if not cluster.alive(i)]
            if dead:
                print(f"error: kafka node(s) {dead} exited", file=sys.stderr)
                return 1
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
