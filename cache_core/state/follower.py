"""A background reader of one Kafka topic that every cache instance runs on its own.

No consumer group: every instance must see every record, so none may take partitions
from another. A follower assigns itself all the topic's partitions, starts where
``start_offsets`` says (default: the beginning; or the end, ``start_at_end``), reads up
to the end offsets it found at connect time (``wait_caught_up``), then keeps following.
If the broker is down, at start or later, it retries with backoff and resumes where it
was. Subclasses handle the records (``handle``, in topic order per partition; ``parse``
reads one as a message) and may act after each polled batch (``after_batch``) or after
every poll, records or not (``after_poll``). The control listener (cache_core.publish.control_topic)
and the entries follower (cache_core.state.replication) replay their topics; the feedback
follower (cache_core.state.feedback) starts at the end, or where a graceful stop left it.
"""
from __future__ import annotations

import logging
import threading
from typing import TypeVar

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import KafkaError
from pydantic import BaseModel, ValidationError

from cache_core.settings import KafkaSettings

log = logging.getLogger(__name__)

MAX_RETRY_S = 10.0
Message = TypeVar("Message", bound=BaseModel)


class TopicMissing(RuntimeError):
    """The followed topic does not exist (yet): topics are created by infra.kafka.topics."""


def consumer_without_group(kafka: KafkaSettings, timeout_s: float, suffix: str) -> KafkaConsumer:
    ms = int(timeout_s * 1000)
    return KafkaConsumer(
        bootstrap_servers=kafka.bootstrap_servers, client_id=f"{kafka.client_id}-{suffix}",
        group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
        allow_auto_create_topics=False, request_timeout_ms=max(ms, 5000),
        bootstrap_timeout_ms=ms, reconnect_backoff_max_ms=2000,
    )


def topic_partitions(consumer: KafkaConsumer, topic: str) -> list[TopicPartition]:
    partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        raise TopicMissing(f"topic {topic!r} does not exist (run infra.kafka.topics)")
    return [TopicPartition(topic, p) for p in sorted(partitions)]


def close_quietly(client: KafkaConsumer | KafkaProducer) -> None:
    try:
        client.close(timeout=1) if isinstance(client, KafkaProducer) else client.close()
    except Exception as exc:  # closing after a failure may fail again; nothing to do about it
        log.debug("kafka client close failed", extra={"error": str(exc)})


class TopicFollower:
    """See the module docstring. ``counters`` name the subclass's own ``stats()`` counts."""

    thread_name = "scache-follower"
    retryable: tuple[type[BaseException], ...] = (KafkaError, TopicMissing, OSError)

    def __init__(self, kafka: KafkaSettings, topic: str, *, poll_timeout_s: float = 0.5,
                 retry_s: float = 1.0, counters: tuple[str, ...] = ()):
        self.kafka = kafka
        self.topic = topic
        self.poll_timeout_s = poll_timeout_s
        self.retry_s = retry_s
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._positions: dict[TopicPartition, int] = {}
        self._targets: dict[TopicPartition, int] = {}
        self._counts = dict.fromkeys(("received", *counters, "handler_errors", "reconnects"), 0)
        self._thread: threading.Thread | None = None

    # -- for subclasses ---------------------------------------------------------------

    def handle(self, record: ConsumerRecord, tp: TopicPartition) -> None:
        """One record. An exception is counted (``handler_errors``) and logged; the next record follows."""
        raise NotImplementedError

    def parse(self, model: type[Message], record: ConsumerRecord, tp: TopicPartition) -> Message | None:
        """``record``'s value as ``model``, or None when it is not one (counted ``malformed``, logged)."""
        try:
            return model.model_validate_json(record.value or b"")
        except ValidationError as exc:
            self._counts["malformed"] = self._counts.get("malformed", 0) + 1
            log.error("skipping a malformed record", extra={
                "topic": self.topic, "partition": tp.partition, "offset": record.offset,
                "error": exc.errors()[0]["msg"]})
            return None

    def after_batch(self) -> None:
        """Called after each poll that returned records (their positions are in ``positions``)."""

    def after_poll(self) -> None:
        """Called after every poll, records or not: at least every ``poll_timeout_s`` while connected."""

    def start_offsets(self) -> dict[TopicPartition, int]:
        """Where to start on the first connect (partitions not named: see ``start_at_end``)."""
        return {}

    def start_at_end(self) -> bool:
        """Partitions without a start offset begin at their end (only what comes next), not
        at their beginning (replay first)."""
        return False

    @property
    def positions(self) -> dict[TopicPartition, int]:
        """The next offset to read, per partition handled so far."""
        return dict(self._positions)

    # -- lifecycle --------------------------------------------------------------------

    def start(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def wait_caught_up(self, timeout_s: float) -> bool:
        """True once every record present at connect time has been handled."""
        return self._caught_up.wait(timeout_s)

    def stats(self) -> dict:
        return {**self._counts, "caught_up": self._caught_up.is_set(),
                "alive": self._thread is not None and self._thread.is_alive()}

    # -- the loop ---------------------------------------------------------------------

    def _run(self) -> None:
        delay = self.retry_s
        if not self._positions:
            self._positions = dict(self.start_offsets())
        while not self._stop.is_set():
            consumer = None
            try:
                consumer = self._connect()
                delay = self.retry_s
                self._follow(consumer)
            except Exception as exc:  # the broker or an unexpected bug: keep the follower alive
                self._counts["reconnects"] += 1
                if isinstance(exc, self.retryable):
                    log.warning("%s disconnected, retrying", self.thread_name,
                                extra={"error": str(exc), "retry_s": delay, "topic": self.topic})
                else:
                    log.exception("%s error, retrying", self.thread_name)
                self._stop.wait(delay)
                delay = min(delay * 2, MAX_RETRY_S)
            finally:
                if consumer is not None:
                    close_quietly(consumer)

    def _connect(self) -> KafkaConsumer:
        consumer = consumer_without_group(self.kafka, timeout_s=5.0, suffix=self.thread_name)
        try:
            tps = topic_partitions(consumer, self.topic)
            consumer.assign(tps)
            for tp in tps:
                if tp in self._positions:
                    consumer.seek(tp, self._positions[tp])  # resume (after a reconnect or a restart)
                elif self.start_at_end():
                    consumer.seek_to_end(tp)
                    # Pinned now, so a reconnect resumes here rather than skipping to a later end.
                    end = consumer.position(tp, timeout_ms=5000)
                    if end is not None:
                        self._positions[tp] = end
                else:
                    consumer.seek_to_beginning(tp)
            self._targets = consumer.end_offsets(tps)
        except BaseException:
            close_quietly(consumer)
            raise
        return consumer

    def _follow(self, consumer: KafkaConsumer) -> None:
        self._check_caught_up(consumer)
        while not self._stop.is_set():
            batches = consumer.poll(timeout_ms=int(self.poll_timeout_s * 1000))
            for tp, records in batches.items():
                for record in records:
                    self._positions[tp] = record.offset + 1
                    self._counts["received"] += 1
                    self._handle_safely(record, tp)
            if batches:
                self.after_batch()
            self._check_caught_up(consumer)
            self.after_poll()

    def _handle_safely(self, record: ConsumerRecord, tp: TopicPartition) -> None:
        try:
            self.handle(record, tp)
        except Exception:  # one bad record must not stop the follower (nor cost it a reconnect)
            self._counts["handler_errors"] += 1
            log.exception("%s: handling a record failed", self.thread_name,
                          extra={"topic": self.topic, "partition": tp.partition, "offset": record.offset})

    def _check_caught_up(self, consumer: KafkaConsumer) -> None:
        # The consumer's position, not the last offset seen: compaction leaves gaps.
        if not self._caught_up.is_set() and all(
                (consumer.position(tp, timeout_ms=5000) or 0) >= end
                for tp, end in self._targets.items()):
            self._caught_up.set()
            log.info("topic replayed", extra={"topic": self.topic, "records": self._counts["received"]})
