"""A single-node KRaft Kafka broker (broker+controller in one JVM) on loopback; the nodes
of infra/kafka/cluster.py are started by the same code (``NodeSpec``, ``spawn_node``).

Its state lives entirely in ``data_dir``: storage is formatted once, so starting
again on the same directory keeps every topic and message. The ports last used are
remembered there too and preferred on a restart, so clients' bootstrap stays valid.
"""
from __future__ import annotations

import argparse
import base64
import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.kafka.resolve import kafka_classpath
from cache_core.runtime import port_open
from infra.runtime import Service, free_port, spawn, wait_until

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
LOG4J_CONFIG = Path(__file__).resolve().parent / "log4j2.properties"
NODE_ID = 1
START_TIMEOUT_S = 120.0


def start_broker(data_dir: Path, port: int | None = None, controller_port: int | None = None,
                 heap: str = "512m") -> Service:
    """Start the single-node broker, wait until it serves metadata, and return its Service.

    ``service.info["bootstrap"]`` is ``127.0.0.1:<port>``. Free ports are chosen when
    a port is None (preferring the ones this data_dir used last, if still free).
    """
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    port, controller_port = _choose_ports(data_dir, port, controller_port)
    service = spawn_node(NodeSpec(data_dir, port, controller_port), heap=heap)
    wait_node_ready(service)
    return service


@dataclass(frozen=True)
class NodeSpec:
    """One KRaft node (broker+controller in one JVM): the single broker, or one node of a
    cluster (infra/kafka/cluster.py), which then names every voter and the shared cluster id."""

    data_dir: Path
    port: int
    controller_port: int
    node_id: int = NODE_ID
    voters: str | None = None
    """``controller.quorum.voters`` (``id@host:port,...``); None: this node alone."""
    cluster_id: str | None = None
    """Formatted into the storage; None: a fresh one (a single node shares it with no one)."""
    replication: int = 1
    """Default RF of the internal topics and of topics created without one."""

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"


def spawn_node(node: NodeSpec, heap: str = "512m", overrides: dict[str, str] | None = None) -> Service:
    """Write the properties, format the storage if new, and start the JVM without waiting:
    a cluster's nodes only answer once a majority of the voters runs."""
    node.data_dir.mkdir(parents=True, exist_ok=True)
    classpath = kafka_classpath()
    props = write_server_properties(node, overrides)
    if not is_formatted(node.data_dir):
        format_storage(classpath, props, heap, node.cluster_id)
    cmd = _java(classpath, heap) + ["kafka.Kafka", str(props)]
    name = "kafka" if node.voters is None else f"kafka-{node.node_id}"
    service = spawn(name, cmd, node.data_dir / "broker.log")
    service.info.update(bootstrap=node.bootstrap, port=node.port, controller_port=node.controller_port,
                        node_id=node.node_id, data_dir=str(node.data_dir), spawned=time.monotonic())
    return service


def wait_node_ready(service: Service, timeout_s: float = START_TIMEOUT_S,
                    ready: Callable[[str], bool] | None = None) -> None:
    """Until the node answers a metadata request (or ``ready(bootstrap)``); kills it on failure."""
    bootstrap = service.info["bootstrap"]
    check = ready or _answers
    try:
        wait_until(lambda: check(bootstrap), timeout_s, f"kafka node {service.info['node_id']}",
                   interval_s=0.5, proc=service.proc, log_path=service.log_path)
    except BaseException:
        service.kill()
        raise
    service.info["start_s"] = round(time.monotonic() - service.info["spawned"], 2)
    log.info("kafka broker ready", extra={"bootstrap": bootstrap, "node_id": service.info["node_id"],
                                          "start_s": service.info["start_s"]})


def _choose_ports(data_dir: Path, port: int | None, controller_port: int | None) -> tuple[int, int]:
    remembered = _read_ports(data_dir)

    def pick(asked: int | None, key: str) -> int:
        if asked is not None:
            return asked
        last = remembered.get(key)
        return last if last and not port_open(HOST, last) and _bindable(last) else free_port(HOST)

    chosen = pick(port, "port"), pick(controller_port, "controller_port")
    (data_dir / "ports.json").write_text(json.dumps(
        {"port": chosen[0], "controller_port": chosen[1]}))
    return chosen


def _read_ports(data_dir: Path) -> dict:
    try:
        return json.loads((data_dir / "ports.json").read_text())
    except (OSError, ValueError):
        return {}


def _bindable(port: int) -> bool:
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
            return True
        except OSError:
            return False


def min_insync_replicas(replication: int) -> int:
    """min.insync.replicas for a replication factor: 2 from RF 3 on (an acknowledged write
    is on two brokers, and one broker may be down), else 1 (RF 2 with min ISR 2 would stop
    every write when either broker is down)."""
    return 2 if replication >= 3 else 1


def server_properties(node: NodeSpec) -> dict[str, str]:
    """A node's configuration: loopback only, explicit topic creation, and the replication
    defaults of its cluster (1 for the single node)."""
    rf, min_isr = str(node.replication), str(min_insync_replicas(node.replication))
    return {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": node.voters or f"{node.node_id}@{HOST}:{node.controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{node.port},CONTROLLER://{HOST}:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(node.data_dir / "logs"),
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
        "default.replication.factor": rf,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": min_isr,
        "group.initial.rebalance.delay.ms": "0",
        # Check for compactable segments often, so the control topic really compacts.
        "log.cleaner.backoff.ms": "2000",
        "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
        "num.network.threads": "2",
        "num.io.threads": "2",
        "background.threads": "2",
    }


def write_server_properties(node: NodeSpec, overrides: dict[str, str] | None = None) -> Path:
    path = node.data_dir / "server.properties"
    props = {**server_properties(node), **(overrides or {})}
    lines = [f"{k}={v}" for k, v in props.items()]
    path.write_text("# Written by infra/kafka/broker.py on every start.\n" + "\n".join(lines) + "\n")
    return path


def is_formatted(data_dir: Path) -> bool:
    return (data_dir / "logs" / "meta.properties").exists()


def format_storage(classpath: str, props: Path, heap: str = "512m", cluster_id: str | None = None) -> None:
    """Format the KRaft log dir once (kafka-storage.sh format), with ``cluster_id`` or a fresh one."""
    # A short-lived tool: the C1 compiler alone starts it faster.
    cmd = _java(classpath, heap) + ["-XX:TieredStopAtLevel=1", "kafka.tools.StorageTool", "format",
                                    "-t", cluster_id or new_cluster_id(), "-c", str(props)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"kafka storage format failed ({done.returncode}):\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, base64url without padding, not starting with '-'."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _java(classpath: str, heap: str) -> list[str]:
    return [
        "java", f"-Xmx{heap}", "-Xms64m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
        "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
        "-cp", classpath,
    ]


def _answers(bootstrap: str) -> bool:
    """True once the broker answers a metadata request (via kafka-python's admin client)."""
    from kafka.admin import KafkaAdminClient

    host, port = bootstrap.rsplit(":", 1)
    if not port_open(host, int(port)):
        return False
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000,
                             bootstrap_timeout_ms=3000, client_id="scache-readiness")
    try:
        return bool(admin.describe_cluster().get("brokers"))
    finally:
        admin.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.kafka.broker",
                                     description="Run a single-node Kafka broker in the foreground.")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--controller-port", type=int, default=None)
    parser.add_argument("--heap", default="512m")
    args = parser.parse_args(argv)
    for flag, port in (("--port", args.port), ("--controller-port", args.controller_port)):
        if port is not None and not 1 <= port <= 65535:
            parser.error(f"{flag} must be 1-65535 (omit it for a free port), got {port}")
    if args.port is not None and args.port == args.controller_port:
        parser.error(f"--port and --controller-port must differ, both are {args.port}")
    if not re.fullmatch(r"[1-9][0-9]*[kKmMgG]?", args.heap):
        parser.error(f"--heap takes a JVM size such as 512m or 2g, got {args.heap!r}")
    from cache_core.logs import configure_logging
    configure_logging()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        service = start_broker(args.data_dir, args.port, args.controller_port, args.heap)
    except (RuntimeError, OSError) as exc:  # TimeoutError is an OSError
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"kafka broker ready at {service.info['bootstrap']} (log: {service.log_path})", flush=True)
    try:
        while not stop.wait(1.0):
            if not service.alive():
                print(f"error: broker exited with {service.proc.returncode}", file=sys.stderr)
                return 1
    finally:
        service.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
