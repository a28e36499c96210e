"""The control topic: experiment configs flowing from the dashboard to every cache instance.

The topic is compacted by experiment id, so reading it from the beginning yields the
latest config of every experiment. Each cache instance runs a ControlListener: a
consumer with no consumer group (every instance must see every message, and none
commits offsets) that replays the topic and then follows it.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from pydantic import ValidationError

from cache_core.events import ControlMessage
from cache_core.settings import KafkaSettings

log = logging.getLogger(__name__)

MAX_RETRY_S = 10.0


class ControlError(RuntimeError):
    """The control topic could not be written or read."""


def _consumer(kafka: KafkaSettings, timeout_s: float, suffix: str) -> KafkaConsumer:
    ms = int(timeout_s * 1000)
    return KafkaConsumer(
        bootstrap_servers=kafka.bootstrap_servers, client_id=f"{kafka.client_id}-{suffix}",
        group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
        allow_auto_create_topics=False, request_timeout_ms=max(ms, 5000),
        bootstrap_timeout_ms=ms, reconnect_backoff_max_ms=2000,
    )


def _control_partitions(consumer: KafkaConsumer, topic: str) -> list[TopicPartition]:
    partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        raise ControlError(f"control topic {topic!r} does not exist (run infra.kafka.topics)")
    return [TopicPartition(topic, p) for p in sorted(partitions)]


def parse_control(value: bytes | None) -> ControlMessage:
    """Parse one control-topic value; raises ValueError on anything malformed."""
    if value is None:
        raise ValueError("tombstone (no value)")
    try:
        return ControlMessage.model_validate_json(value)
    except ValidationError as exc:
        raise ValueError(f"invalid control message: {exc.error_count()} error(s): "
                         f"{exc.errors()[0]['msg']}") from None


class ControlListener:
    """Replays the control topic from the beginning, then follows it, in a background thread.

    ``on_message`` is called in that thread, in topic order. Malformed messages and
    handler exceptions are logged, counted in ``stats()``, and skipped. If the broker
    is down (at start or later), the listener keeps retrying and resumes where it was.
    """

    def __init__(self, kafka: KafkaSettings, on_message: Callable[[ControlMessage], None],
                 poll_timeout_s: float = 0.5, retry_s: float = 1.0):
        self.kafka = kafka
        self.on_message = on_message
        self.poll_timeout_s = poll_timeout_s
        self.retry_s = retry_s
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._positions: dict[TopicPartition, int] = {}
        self._targets: dict[TopicPartition, int] = {}
        self._counts = dict.fromkeys(("received", "applied", "malformed", "handler_errors",
                                      "reconnects"), 0)
        self._thread: threading.Thread | None = None

    def start(self) -> ControlListener:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="scache-control", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def wait_caught_up(self, timeout_s: float) -> bool:
        """True once every message present at connect time has been handled."""
        return self._caught_up.wait(timeout_s)

    def stats(self) -> dict:
        return {**self._counts, "caught_up": self._caught_up.is_set(),
                "alive": self._thread is not None and self._thread.is_alive()}

    def _run(self) -> None:
        delay = self.retry_s
        while not self._stop.is_set():
            consumer = None
            try:
                consumer = self._connect()
                delay = self.retry_s
                self._follow(consumer)
            except (KafkaError, ControlError, OSError) as exc:
                self._counts["reconnects"] += 1
                log.warning("control listener disconnected, retrying",
                            extra={"error": str(exc), "retry_s": delay})
                self._stop.wait(delay)
                delay = min(delay * 2, MAX_RETRY_S)
            except Exception:  # unexpected: log and keep the listener alive
                self._counts["reconnects"] += 1
                log.exception("control listener error, retrying")
                self._stop.wait(delay)
                delay = min(delay * 2, MAX_RETRY_S)
            finally:
                if consumer is not None:
                    _close_quietly(consumer)

    def _connect(self) -> KafkaConsumer:
        consumer = _consumer(self.kafka, timeout_s=5.0, suffix="control-listener")
        try:
            tps = _control_partitions(consumer, self.kafka.control_topic)
            consumer.assign(tps)
            for tp in tps:
                if tp in self._positions:
                    consumer.seek(tp, self._positions[tp])  # resume after a reconnect
                else:
                    consumer.seek_to_beginning(tp)
            self._targets = consumer.end_offsets(tps)
        except BaseException:
            _close_quietly(consumer)
            raise
        return consumer

    def _follow(self, consumer: KafkaConsumer) -> None:
        self._check_caught_up(consumer)
        while not self._stop.is_set():
            batches = consumer.poll(timeout_ms=int(self.poll_timeout_s * 1000))
            for tp, records in batches.items():
                for record in records:
                    self._handle(record.value, tp, record.offset)
            self._check_caught_up(consumer)

    def _handle(self, value: bytes | None, tp: TopicPartition, offset: int) -> None:
        self._positions[tp] = offset + 1
        self._counts["received"] += 1
        try:
            msg = parse_control(value)
        except ValueError as exc:
            self._counts["malformed"] += 1
            log.error("skipping malformed control message",
                      extra={"partition": tp.partition, "offset": offset, "error": str(exc)})
            return
        try:
            self.on_message(msg)
            self._counts["applied"] += 1
        except Exception:
            self._counts["handler_errors"] += 1
            log.exception("control handler failed", extra={
                "offset": offset, "experiment_id": msg.experiment.experiment_id})

    def _check_caught_up(self, consumer: KafkaConsumer) -> None:
        # The consumer's position, not the last offset seen: compaction leaves gaps.
        if not self._caught_up.is_set() and all(
                (consumer.position(tp, timeout_ms=5000) or 0) >= end
                for tp, end in self._targets.items()):
            self._caught_up.set()
            log.info("control topic replayed", extra={"messages": self._counts["received"]})


def publish_control(kafka: KafkaSettings, msg: ControlMessage, timeout_s: float = 10) -> None:
    """Write one control message and wait for the broker's ack (acks=all)."""
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
    try:
        future = producer.send(kafka.control_topic, key=msg.kafka_key(),
                               value=msg.model_dump_json().encode())
        future.get(timeout=timeout_s)
    except KafkaError as exc:
        raise ControlError(f"control message for experiment {msg.experiment.experiment_id!r} "
                           f"not acknowledged by {target}: {exc}") from exc
    finally:
        _close_quietly(producer)


def read_latest_configs(kafka: KafkaSettings, timeout_s: float = 5) -> dict[str, ControlMessage]:
    """The latest control message per experiment id, reading the topic up to its end offsets.

    Raises ControlError if Kafka cannot be reached or the end is not reached in time.
    """
    deadline = time.monotonic() + timeout_s
    try:
        consumer = _consumer(kafka, timeout_s, suffix="control-reader")
    except KafkaError as exc:
        raise ControlError(f"cannot connect to Kafka at {kafka.bootstrap_servers}: {exc}") from exc
    latest: dict[str, ControlMessage] = {}
    try:
        tps = _control_partitions(consumer, kafka.control_topic)
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        while any((consumer.position(tp, timeout_ms=int(timeout_s * 1000)) or 0) < ends[tp]
                  for tp in tps):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ControlError(f"control topic {kafka.control_topic!r} not read to its end "
                                   f"within {timeout_s}s")
            for tp, records in consumer.poll(timeout_ms=int(min(remaining, 0.5) * 1000)).items():
                for record in records:
                    _keep_latest(latest, record.key, record.value, record.offset)
    except KafkaError as exc:
        raise ControlError(f"reading control topic {kafka.control_topic!r} failed: {exc}") from exc
    finally:
        _close_quietly(consumer)
    return latest


def _keep_latest(latest: dict[str, ControlMessage], key: bytes | None, value: bytes | None,
                 offset: int) -> None:
    if value is None and key is not None:
        latest.pop(key.decode(errors="replace"), None)  # tombstone: experiment removed
        return
    try:
        msg = parse_control(value)
    except ValueError as exc:
        log.warning("skipping malformed control message", extra={"offset": offset, "error": str(exc)})
        return
    latest[msg.experiment.experiment_id] = msg


def _close_quietly(client: KafkaConsumer | KafkaProducer) -> None:
    try:
        client.close(timeout=1) if isinstance(client, KafkaProducer) else client.close()
    except Exception as exc:  # closing after a failure may fail again; nothing to do about it
        log.debug("kafka client close failed", extra={"error": str(exc)})
