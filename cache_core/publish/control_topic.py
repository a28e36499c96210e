"""The control topic: experiment configs flowing from the dashboard to every cache instance.

Every record is keyed ``<experiment id>/v<version>/<message id>`` (``control_key``), so
compaction never drops a change (see infra/kafka/topics.py for why); records keyed by
the experiment id alone (written before) are still read. Which record is in force is
decided by ``cache_core.registry.ControlFold`` alone, for every reader. Each cache
instance runs a ControlListener: a consumer with no consumer group (every instance
must see every message, and none commits offsets) that replays the topic and then
follows it.
"""
from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from pydantic import ValidationError

from cache_core.events import ControlMessage
from cache_core.experiments import ExperimentConfig
from cache_core.state.follower import TopicFollower, TopicMissing, close_quietly, consumer_without_group, topic_partitions
from cache_core.registry import ControlFold, ControlRecord
from cache_core.settings import KafkaSettings

log = logging.getLogger(__name__)


class ControlError(RuntimeError):
    """The control topic could not be written or read."""


@dataclass(frozen=True)
class PublishedControl:
    """Where the broker stored a control message (known once it acknowledged it)."""

    key: bytes
    partition: int
    offset: int


KEY_SEPARATOR = "/"  # never in an experiment id (ExperimentConfig: [A-Za-z0-9_.-]+)


def control_key(msg: ControlMessage, message_id: str | None = None) -> bytes:
    """``<experiment id>/v<version>/<message id>``: unique per message, so compaction
    keeps every change, while staying readable in a console consumer."""
    message_id = message_id or uuid.uuid4().hex
    return KEY_SEPARATOR.join((msg.experiment.experiment_id, f"v{msg.experiment.version}",
                               message_id)).encode()


def parse_control(value: bytes | None) -> ControlMessage:
    """Parse one control-topic value; raises ValueError on anything malformed."""
    if value is None:
        raise ValueError("tombstone (no value)")
    try:
        # Strict like the admin API: a field no reader knows, or "2" for a version, is refused
        # (counted as malformed by the listener), not silently ignored or coerced.
        return ControlMessage.model_validate_json(value, strict=True)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(map(str, first["loc"])) or "message"
        raise ValueError(f"invalid control message: {exc.error_count()} error(s): "
                         f"{where}: {first['msg']}") from None


def _control_partitions(consumer: KafkaConsumer, topic: str) -> list[TopicPartition]:
    try:
        return topic_partitions(consumer, topic)
    except TopicMissing as exc:
        raise ControlError(f"control {exc}") from None


class ControlListener(TopicFollower):
    """Replays the control topic from the beginning, then follows it, in a background thread
    (``cache_core.state.follower.TopicFollower``: reconnects and resumes if the broker goes away).

    Handlers are called in that thread, in topic order: ``on_record`` gets every record
    (tombstones and unreadable values as a ControlRecord without message, since they
    still remove the earlier record with their key: what ``ExperimentRegistry.apply_record``
    folds); ``on_message`` gets only the valid messages. Malformed messages and handler
    exceptions are logged, counted in ``stats()``, and skipped.
    """

    thread_name = "scache-control"

    def __init__(self, kafka: KafkaSettings, on_message: Callable[[ControlMessage], None] | None = None,
                 poll_timeout_s: float = 0.5, retry_s: float = 1.0, *,
                 on_record: Callable[[ControlRecord], None] | None = None):
        if (on_message is None) == (on_record is None):
            raise ValueError("give exactly one of on_message and on_record")
        super().__init__(kafka, kafka.control_topic, poll_timeout_s=poll_timeout_s, retry_s=retry_s,
                         counters=("applied", "malformed", "tombstones"))
        self.on_message = on_message
        self.on_record = on_record

    def handle(self, record, tp: TopicPartition) -> None:
        msg = _parse_record(record.key, record.value, tp.partition, record.offset)
        if msg is None:
            self._counts["tombstones" if record.value is None else "malformed"] += 1
            if self.on_record is None:
                return
        try:
            if self.on_record is not None:
                self.on_record(ControlRecord(record.key, msg, record.offset))
            else:
                self.on_message(msg)
            self._counts["applied"] += 1
        except Exception:
            self._counts["handler_errors"] += 1
            log.exception("control handler failed", extra={
                "offset": record.offset, "experiment_id": msg.experiment.experiment_id if msg else None})


def publish_control(kafka: KafkaSettings, msg: ControlMessage, timeout_s: float = 10) -> PublishedControl:
    """Write one control message under a fresh unique key and wait for the broker's ack
    (acks=all); returns where it was stored. Whether it won is for the fold to say
    (``read_control`` up to that offset): a concurrent push may have claimed its version."""
    ms = int(timeout_s * 1000)
    target = f"topic {kafka.control_topic!r} at {kafka.bootstrap_servers}"
    try:
        producer = KafkaProducer(
            bootstrap_servers=kafka.bootstrap_servers, client_id=f"{kafka.client_id}-control",
            acks="all", enable_idempotence=True, allow_auto_create_topics=False,
            bootstrap_timeout_ms=ms, max_block_ms=ms, request_timeout_ms=max(1000, ms // 2),
            delivery_timeout_ms=ms,
        )
    except KafkaError as exc:
        raise ControlError(f"cannot connect to Kafka for {target}: {exc}") from exc
    key = control_key(msg)
    try:
        future = producer.send(kafka.control_topic, key=key, value=msg.model_dump_json().encode())
        meta = future.get(timeout=timeout_s)
    except KafkaError as exc:
        raise ControlError(f"control message for experiment {msg.experiment.experiment_id!r} "
                           f"not acknowledged by {target}: {exc}") from exc
    finally:
        close_quietly(producer)
    return PublishedControl(key=key, partition=meta.partition, offset=meta.offset)


class ControlLost(RuntimeError):
    """The message was published, but another record had claimed its version first:
    by the fold it applies nowhere (``winner``: the config in force instead, if any)."""

    def __init__(self, msg: ControlMessage, winner: ExperimentConfig | None):
        by = f"by {winner.updated_by} at version {winner.version}" if winner else "by a tombstone"
        super().__init__(f"config version {msg.experiment.version} of {msg.experiment.experiment_id!r} "
                         f"was published but lost to a concurrent push ({by}); it applies nowhere")
        self.winner = winner


class ControlUnconfirmed(ControlError):
    """The message was published, but reading the topic back to confirm it won failed."""


def publish_confirmed(kafka: KafkaSettings, msg: ControlMessage, *,
                      base: Mapping[str, ExperimentConfig] | None = None,
                      timeout_s: float = 10) -> PublishedControl:
    """publish_control, then fold the topic up to our own record (over ``base``) to
    confirm no concurrent push claimed the same version first. Raises ControlError if
    nothing was published, ControlLost if it lost, ControlUnconfirmed if it cannot tell."""
    published = publish_control(kafka, msg, timeout_s)
    experiment_id = msg.experiment.experiment_id
    try:
        winner = read_control(kafka, timeout_s, base=base, until=published).winner(experiment_id)
    except ControlError as exc:
        raise ControlUnconfirmed(f"config version {msg.experiment.version} of {experiment_id!r} was "
                                 f"published (offset {published.offset}) but not confirmed: {exc}") from exc
    if winner is None or winner.key != published.key:
        raise ControlLost(msg, winner.config if winner else None)
    return published


def read_control(kafka: KafkaSettings, timeout_s: float = 5, *,
                 base: Mapping[str, ExperimentConfig] | None = None,
                 until: PublishedControl | None = None) -> ControlFold:
    """Fold the control topic from its beginning (over ``base``, e.g. the experiments file)
    up to its end offsets, or with ``until`` up to and including that record (its own
    partition; other partitions to their end).

    Raises ControlError if Kafka cannot be reached or the end is not reached in time.
    """
    deadline = time.monotonic() + timeout_s
    try:
        consumer = consumer_without_group(kafka, timeout_s, suffix="control-reader")
    except KafkaError as exc:
        raise ControlError(f"cannot connect to Kafka at {kafka.bootstrap_servers}: {exc}") from exc
    fold = ControlFold(base)
    try:
        tps = _control_partitions(consumer, kafka.control_topic)
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        if until is not None:
            mine = TopicPartition(kafka.control_topic, until.partition)
            if mine not in ends:
                raise ControlError(f"control topic {kafka.control_topic!r} has no partition {until.partition}")
            ends[mine] = until.offset + 1
        while any((consumer.position(tp, timeout_ms=int(timeout_s * 1000)) or 0) < ends[tp]
                  for tp in tps):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ControlError(f"control topic {kafka.control_topic!r} not read to its end "
                                   f"within {timeout_s}s")
            for tp, records in consumer.poll(timeout_ms=int(min(remaining, 0.5) * 1000)).items():
                for record in records:
                    if record.offset < ends[tp]:
                        fold.offer(record.key, _parse_record(record.key, record.value, tp.partition,
                                                             record.offset))
    except KafkaError as exc:
        raise ControlError(f"reading control topic {kafka.control_topic!r} failed: {exc}") from exc
    finally:
        close_quietly(consumer)
    return fold


def read_latest_configs(kafka: KafkaSettings, timeout_s: float = 5) -> dict[str, ControlMessage]:
    """The winning control message per experiment id (``ControlFold``), reading the topic
    up to its end offsets. Raises ControlError like ``read_control``."""
    return read_control(kafka, timeout_s).messages()


def _parse_record(key: bytes | None, value: bytes | None, partition: int, offset: int) -> ControlMessage | None:
    """The record's message; None for a tombstone or (logged) an unreadable value."""
    if value is None:
        return None
    try:
        return parse_control(value)
    except ValueError as exc:
        log.error("skipping malformed control message", extra={
            "partition": partition, "offset": offset, "key": key.decode(errors="replace") if key else None,
            "error": str(exc)})
        return None
