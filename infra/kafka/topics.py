"""Explicit, idempotent creation of scache's topics (the broker never auto-creates).

- events: cache decisions and heartbeats, keyed by unit, time-retained.
- control: full experiment configs, compacted, one partition (a single total order of
  config changes; every cache instance replays it at start). See below for its keys.
- feedback: verdicts keyed by request id, time-retained.
- entries: what each cache replica stored or cleared, keyed by namespace, retained for the
  longest entry lifetime, so replicas share entries and a new one warms up from it; also
  the intent-cluster changes, the model re-sent within the retention (cache_core.state.replication).

Control keys. Which config is in force is decided by one fold over the partition
(cache_core.registry.ControlFold): a message wins iff its version is higher than
the winner so far, so when two pushes race from the same version, the *first* one
in partition order wins on every running instance. Keyed by experiment id alone,
compaction would then keep only the *second* (the loser), and every reader that
starts later would disagree with the running caches. So each record has its own key,
``<experiment id>/v<version>/<message id>`` (cache_core.publish.control_topic.control_key, the
message id a fresh UUID): no record ever shares a key with another, compaction
removes nothing, and the fold gives the same winners before and after the cleaner
runs. (The fold also lets a record remove the earlier one with its key, as compaction
does, which keeps records keyed the old way, by experiment id alone, reading exactly
as the cleaner leaves them.) The price is one record per config change kept forever:
configs change a few times a day at most, a few KB each. Removing an experiment
means a tombstone for each of its keys; nothing in scache does that today.
Compaction is still on for the old-format keys and for such tombstones.
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
import time

import kafka.errors as Errors
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

from cache_core.events import ENTRY_MESSAGE_MAX_BYTES
from cache_core.settings import KafkaSettings
from infra.kafka.broker import min_insync_replicas

log = logging.getLogger(__name__)

# Small segments and a low dirty ratio so the cleaner compacts the control topic
# within minutes instead of after the default 7-day segment roll.
CONTROL_TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.ms": str(60_000),
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": str(24 * 3600 * 1000),
}


def topic_specs(kafka: KafkaSettings) -> dict[str, dict]:
    """Topic name -> create options (kafka-python's dict form).

    Every topic carries its own min.insync.replicas (2 from RF 3 on, else 1), so with
    SCACHE_KAFKA__REPLICATION_FACTOR=3 an acknowledged write (the producers use acks=all)
    is on two brokers whatever the brokers' default, and writes go on with one broker down.
    """
    durability = {"min.insync.replicas": str(min_insync_replicas(kafka.replication_factor))}
    retained = {"cleanup.policy": "delete", "retention.ms": str(kafka.events_retention_ms), **durability}
    return {
        kafka.events_topic: {"num_partitions": kafka.events_partitions,
                             "replication_factor": kafka.replication_factor, "configs": retained},
        kafka.control_topic: {"num_partitions": 1, "replication_factor": kafka.replication_factor,
                              "configs": {**CONTROL_TOPIC_CONFIGS, **durability}},
        kafka.feedback_topic: {"num_partitions": kafka.feedback_partitions,
                               "replication_factor": kafka.replication_factor, "configs": retained},
        kafka.entries_topic: {"num_partitions": kafka.entries_partitions,
                              "replication_factor": kafka.replication_factor,
                              "configs": {"cleanup.policy": "delete",
                                          "retention.ms": str(kafka.entries_retention_ms),
                                          "max.message.bytes": str(ENTRY_MESSAGE_MAX_BYTES), **durability}},
    }


def admin_client(kafka: KafkaSettings, timeout_s: float = 10.0) -> KafkaAdminClient:
    ms = int(timeout_s * 1000)
    return KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers, client_id=f"{kafka.client_id}-admin",
                            request_timeout_ms=ms, bootstrap_timeout_ms=ms)


def ensure_topics(kafka: KafkaSettings, timeout_s: float = 30.0) -> None:
    """Create missing topics, reconcile existing ones, wait until every partition has a leader.

    Safe to repeat. An existing topic with fewer partitions than configured is grown; one
    with more is left alone (Kafka cannot shrink a topic) and a warning is logged, as for
    a replication factor other than configured (changing it means a reassignment, an
    operator's decision). Of an existing topic's configs, those scache manages (the
    ``configs`` of topic_specs) are set back to scache's values at topic level, so a topic
    created by an older version gets today's min.insync.replicas; any other config an
    operator set on the topic is kept.
    """
    specs = topic_specs(kafka)
    admin = admin_client(kafka, timeout_s)
    try:
        result = admin.create_topics(specs, timeout_ms=int(timeout_s * 1000), raise_errors=False)
        created = set()
        for topic in result["topics"]:
            error = Errors.for_code(topic["error_code"])
            if error is Errors.NoError:
                created.add(topic["name"])
                log.info("created topic", extra={"topic": topic["name"]})
            elif error is not Errors.TopicAlreadyExistsError:
                raise RuntimeError(f"cannot create topic {topic['name']}: {error.__name__} "
                                   f"{topic.get('error_message') or ''}".rstrip())
        admin.wait_for_topics(list(specs), timeout_ms=int(timeout_s * 1000))
        # Just created: with its partitions (a broker's metadata may not show them all yet).
        _grow_partitions(admin, {name: spec for name, spec in specs.items() if name not in created}, timeout_s)
        _warn_on_replication(admin, specs)
        _reconcile_configs(admin, specs)
    finally:
        admin.close()


def config_changes(specs: dict[str, dict], described: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """Topic -> {key: (old value, old source, new value)} for the managed configs to set.

    ``described`` is describe_configs(config_filter="all")["topic"]. A managed key is set
    when its effective value differs, and also when the value comes from the broker (a
    default or a broker-level setting) rather than the topic: scache pins its configs on
    the topic, as at creation, so they hold whatever the brokers' defaults become.
    """
    changes: dict[str, dict] = {}
    for topic, spec in specs.items():
        have = described.get(topic, {})
        diff = {}
        for key, want in spec["configs"].items():
            entry = have.get(key) or {}
            old, source = entry.get("value"), entry.get("config_source")
            if old != want or source != "DYNAMIC_TOPIC_CONFIG":
                diff[key] = (old, source, want)
        if diff:
            changes[topic] = diff
    return changes


def _reconcile_configs(admin: KafkaAdminClient, specs: dict[str, dict], incremental: bool | None = None) -> None:
    """incremental=None: IncrementalAlterConfigs if the broker has it (tests force False)."""
    resources = [ConfigResource(ConfigResourceType.TOPIC, topic) for topic in specs]
    described = admin.describe_configs(resources, config_filter="all").get("topic", {})
    changes = config_changes(specs, described)
    if not changes:
        return
    for topic, diff in changes.items():
        for key, (old, source, new) in diff.items():
            log.info("changing topic config", extra={"topic": topic, "config": key, "old": old,
                                                     "old_source": source, "new": new})
    # Only the changed keys are sent. On a broker with IncrementalAlterConfigs (Kafka 2.3+)
    # kafka-python uses it (SET per key, nothing else touched); on an older one it sends the
    # legacy AlterConfigs, which resets every key not sent, and first adds every other
    # non-default key it reads back from the topic, so operator-set configs survive either way.
    result = admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic,
                                                 {key: new for key, (_, _, new) in diff.items()})
                                  for topic, diff in changes.items()], incremental=incremental)
    failed = {topic: outcome for topic, outcome in result.get("topic", {}).items() if outcome != "OK"}
    missing = set(changes) - set(result.get("topic", {}))
    if failed or missing:
        raise RuntimeError(f"cannot change topic configs: {failed or ''} "
                           f"{'no answer for ' + str(sorted(missing)) if missing else ''}".strip())


def _warn_on_replication(admin: KafkaAdminClient, specs: dict[str, dict]) -> None:
    for topic in admin.describe_topics(list(specs)):
        want = specs[topic["name"]]["replication_factor"]
        have = sorted({len(p["replica_nodes"]) for p in topic["partitions"]})
        if have != [want]:
            log.warning("topic has a replication factor other than configured (not changed)",
                        extra={"topic": topic["name"], "have": have, "want": want})


def _grow_partitions(admin: KafkaAdminClient, specs: dict[str, dict], timeout_s: float) -> None:
    grown = []
    for topic in admin.describe_topics(list(specs)) if specs else ():
        have, want = len(topic["partitions"]), specs[topic["name"]]["num_partitions"]
        if have < want:
            log.info("adding partitions", extra={"topic": topic["name"], "from": have, "to": want})
            if _create_partitions(admin, topic["name"], want):
                grown.append(topic["name"])
        elif have > want:
            log.warning("topic has more partitions than configured",
                        extra={"topic": topic["name"], "have": have, "want": want})
    if grown:
        # New partitions reach the broker's metadata a little after the ack.
        deadline = time.monotonic() + timeout_s
        while any(len(t["partitions"]) < specs[t["name"]]["num_partitions"]
                  for t in admin.describe_topics(grown)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"new partitions of {grown} not visible after {timeout_s}s")
            time.sleep(0.1)
        admin.wait_for_topics(grown, timeout_ms=int(timeout_s * 1000))


def _create_partitions(admin: KafkaAdminClient, topic: str, want: int) -> bool:
    """Grow ``topic`` to ``want`` partitions; False when the controller says it has them already
    (the metadata we read was stale: another ensure_topics grew it, or it was just created)."""
    try:
        admin.create_partitions({topic: want})
        return True
    except Errors.InvalidPartitionsError as exc:
        already = re.search(r"already has (\d+) partition", str(exc))
        if already and int(already.group(1)) >= want:
            return False
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.kafka.topics",
                                     description="Create scache's Kafka topics (from SCACHE_KAFKA__* settings).")
    parser.add_argument("--bootstrap", help="override SCACHE_KAFKA__BOOTSTRAP_SERVERS")
    parser.add_argument("--timeout-s", type=float, default=30.0,
                        help="give up on an unreachable or slow cluster after this long (default 30)")
    args = parser.parse_args(argv)
    if not 0 < args.timeout_s < float("inf"):
        parser.error(f"--timeout-s must be a positive number of seconds, got {args.timeout_s}")
    from cache_core.logs import configure_logging
    from cache_core.settings import settings_or_exit
    configure_logging()
    kafka = settings_or_exit("topics").kafka
    if args.bootstrap is not None:
        kafka = kafka.model_copy(update={"bootstrap_servers": args.bootstrap})
    for server in kafka.bootstrap_servers.split(","):  # else the client fails with int()'s message
        host, _, port = server.strip().rpartition(":")
        if not host or not port.isdigit():
            print(f"error: bootstrap server {server.strip()!r} is not host:port", file=sys.stderr)
            return 2
    try:
        ensure_topics(kafka, timeout_s=args.timeout_s)
    except (RuntimeError, Errors.KafkaError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("topics ready: " + ", ".join(topic_specs(kafka)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
