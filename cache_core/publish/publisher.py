"""Non-blocking publication of cache events, feedback and entry changes to Kafka, with an on-disk spool.

Request threads only serialise a message and put it on a bounded in-memory queue
(``publish_*`` never waits for Kafka). One background thread drains the queue:

- broker healthy and spool empty: send the batch (acks=all, idempotent producer) and
  wait for the acks; whatever was not acknowledged goes to the spool, in order;
- otherwise: append the batch to the spool (``cache_core.publish.spool``), so older messages
  always leave before newer ones, and retry the spool with backoff once the broker
  is reachable again.

A broker that stalls rather than refuses (a leader failing over, a broker paused) keeps
the drain thread waiting for acks for up to ``send_timeout_s``; meanwhile the request
threads go on filling the queue. So the wait is taken in slices, and once the queue is
half full the drain thread moves what is queued to the spool (``stats()["spilled"]``),
from where it is sent after the stalled batch. The same spill catches a queue filling
because events are offered faster than one batch at a time is acknowledged. At 6,000
events/s through a 6 s leader failover the queue of 20,000 used to overflow (26,570
events dropped, bench/failover_publisher.py); a spill keeps them. The spilled events are
newer than the stalled batch, so order holds when that batch is acknowledged, as it is
after a failover; if it fails instead, its records are spooled behind the spilled ones
(``stats()["reordered"]``: a unit's events may then arrive out of order, none is lost).

Nothing is lost unless the spool is full (or the in-memory queue overflows before the
drain thread can spill it); such losses are counted in ``stats()["dropped"]`` and
logged. Delivery is at least once:
a message whose ack was lost in a broker failure is sent again from the spool.
Heartbeats are never spooled (a stale heartbeat would not advance any watermark).

Size. ``EventPublisher`` is ~350 lines, past the project's ~300: the order guarantee above
(queue, then Kafka or the spool, spill, replay) is held by one drain thread over one
producer, queue and spool, and every private method moves messages between those three.
The candidate cut, when it grows, is the producer handling (``_send`` to ``_force_close``).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path

from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError

from cache_core.events import ENTRY_MESSAGE_MAX_BYTES, CacheEvent, EntryMessage, FeedbackEvent
from cache_core.settings import KafkaSettings
from cache_core.publish.spool import Record, Spool
from cache_core.runtime import port_open

log = logging.getLogger(__name__)

MIB = 1024 * 1024
_HEARTBEAT = object()
"""Queue marker: expanded into one heartbeat per events partition at send time."""
ACK_WAIT_SLICE_S = 0.2
"""How often a drain thread waiting for acks checks whether the queue needs spilling."""


class EventPublisher:
    """Publishes CacheEvent / FeedbackEvent off the request path; see the module doc."""

    def __init__(self, kafka: KafkaSettings, spool_dir: Path, instance_id: str,
                 max_spool_bytes: int = 256 * MIB, queue_size: int = 20_000,
                 send_timeout_s: float = 10.0, max_batch: int = 500,
                 max_backoff_s: float = 5.0):
        self.kafka = kafka
        self.instance_id = instance_id
        self.send_timeout_s = send_timeout_s
        self.max_batch = max_batch
        self.max_backoff_s = max_backoff_s
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._spool = Spool(Path(spool_dir), max_spool_bytes)
        self._producer: KafkaProducer | None = None
        self._healthy = True
        self._retry_at = 0.0
        self._backoff_s = 0.5
        self._counts = dict.fromkeys(
            ("published", "spooled", "replayed", "dropped", "heartbeats", "send_failures", "spilled",
             "reordered"), 0)
        self._counts_lock = threading.Lock()
        self._progress = threading.Condition()
        self._stopping = threading.Event()
        self._closed = False
        self._heartbeat_stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self._spill_logged_at = 0.0
        if not self._spool.empty():
            log.info("replaying spool left by an earlier run",
                     extra={"spool_bytes": self._spool.pending_bytes, "dir": str(spool_dir)})
        self._thread = threading.Thread(target=self._run, name="scache-publisher", daemon=True)
        self._thread.start()

    # -- public API (called from request threads) -------------------------------------

    def publish_event(self, event: CacheEvent) -> None:
        """Queue a cache event for the events topic; never blocks."""
        self._offer(Record(self.kafka.events_topic, event.kafka_key(), event.model_dump_json().encode()))

    def publish_feedback(self, feedback: FeedbackEvent) -> None:
        """Queue a verdict for the feedback topic; never blocks."""
        self._offer(Record(self.kafka.feedback_topic, feedback.kafka_key(),
                           feedback.model_dump_json().encode()))

    def publish_entry(self, message: EntryMessage) -> None:
        """Queue an entry change for the entries topic (the other replicas); never blocks."""
        self._offer(Record(self.kafka.entries_topic, message.kafka_key(), message.model_dump_json().encode()))

    def start_heartbeats(self, interval_s: float) -> None:
        """Every ``interval_s``, send a heartbeat to every events partition (idempotent)."""
        if interval_s <= 0:
            raise ValueError(f"heartbeat interval must be positive, got {interval_s}")
        if self._heartbeat_thread is not None:
            return
        def beat() -> None:
            while not self._heartbeat_stop.wait(interval_s):
                self._offer(_HEARTBEAT)
        self._heartbeat_thread = threading.Thread(target=beat, name="scache-heartbeat", daemon=True)
        self._heartbeat_thread.start()

    def stats(self) -> dict:
        """Counters since start; ``spool_bytes`` is what still waits on disk."""
        with self._counts_lock:
            out = dict(self._counts)
        out.update(queue_depth=self._queue.qsize(), queue_size=self._queue.maxsize,
                   spool_bytes=self._spool.pending_bytes, max_spool_bytes=self._spool.max_bytes,
                   broker_healthy=self._healthy)
        return out

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything offered so far is delivered (or dropped); False on timeout."""
        deadline = time.monotonic() + timeout_s
        self._retry_at = 0.0  # retry the broker now rather than after the backoff
        with self._progress:
            while not self._settled():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    return self._settled()
                self._progress.wait(min(remaining, 0.2))
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush, then stop; what could not be delivered stays in the spool for the next run."""
        if self._closed:
            return
        self._heartbeat_stop.set()
        # With the broker known to be down, one quick retry; the spool keeps the rest.
        self.flush(timeout_s if self._healthy else min(timeout_s, 1.0))
        self._closed = True
        self._stopping.set()
        self._thread.join(timeout=timeout_s + 5)
        self._drop_producer(graceful=True)
        self._spool.close()

    # -- queueing ---------------------------------------------------------------------

    def _offer(self, item: object) -> None:
        if self._closed:
            self._count("dropped")
            log.warning("publisher closed, message dropped")
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            if item is not _HEARTBEAT:
                self._count("dropped")
                log.error("publish queue full, message dropped",
                          extra={"queue_size": self._queue.maxsize})

    def _settled(self) -> bool:
        return self._queue.unfinished_tasks == 0 and self._spool.empty()

    def _count(self, name: str, n: int = 1) -> None:
        if n:
            with self._counts_lock:
                self._counts[name] += n

    # -- the drain thread -------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            batch = self._take_batch()
            try:
                if batch:
                    self._handle(batch)
                    self._spill_queue()  # offered faster than sent: to disk rather than dropped
                # Also probe when unhealthy with nothing spooled (e.g. only heartbeats
                # failed), else heartbeats would stay off through a quiet period.
                if (not self._spool.empty() or not self._healthy) and time.monotonic() >= self._retry_at:
                    self._replay()
            except Exception:  # never let the drain thread die: that would lose messages
                log.exception("publisher drain loop error")
                self._mark_unhealthy()
            finally:
                for _ in batch:
                    self._queue.task_done()
            with self._progress:
                self._progress.notify_all()
        self._spool_leftovers()

    def _take_batch(self) -> list:
        batch = []
        try:
            batch.append(self._queue.get(timeout=0.1))
        except queue.Empty:
            return batch
        while len(batch) < self.max_batch:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _handle(self, batch: list) -> None:
        if not self._healthy or not self._spool.empty():
            self._to_spool([item for item in batch if item is not _HEARTBEAT])
            return
        records = self._expand_heartbeats(batch)
        spilled_before = self._counts["spilled"]
        failed = [records[i] for i in self._send(records)]
        self._count("published", len(records) - len(failed) - self._heartbeats_in(records, failed))
        retry = [r for r in failed if r.partition is None]
        if retry and self._counts["spilled"] > spilled_before:  # newer events are in the spool already
            self._count("reordered", len(retry))
            log.warning("a stalled batch failed after the queue was spilled: it is spooled behind newer events",
                        extra={"records": len(retry)})
        self._to_spool(retry)

    def _expand_heartbeats(self, batch: list) -> list[Record]:
        records: list[Record] = []
        for item in batch:
            if item is not _HEARTBEAT:
                records.append(item)
                continue
            for partition in self._events_partitions():
                beat = CacheEvent(event_type="heartbeat", instance_id=self.instance_id)
                records.append(Record(self.kafka.events_topic, beat.kafka_key(),
                                      beat.model_dump_json().encode(), partition=partition))
        return records

    def _events_partitions(self) -> list[int]:
        try:
            producer = self._ensure_producer()
            return sorted(producer.partitions_for(self.kafka.events_topic) or ())
        except (KafkaError, OSError) as exc:
            log.warning("no partitions for heartbeats", extra={"error": str(exc)})
            return []

    def _heartbeats_in(self, records: list[Record], failed: list[Record]) -> int:
        # Heartbeats are the only records with an explicit partition.
        sent = sum(1 for r in records if r.partition is not None)
        lost = sum(1 for r in failed if r.partition is not None)
        self._count("heartbeats", sent - lost)
        return sent - lost

    def _to_spool(self, records: list[Record]) -> None:
        if not records:
            return
        written = self._spool.append(records)
        self._count("spooled", written)
        if written < len(records):
            self._count("dropped", len(records) - written)
            log.error("spool full, messages dropped", extra={
                "dropped": len(records) - written, "spool_bytes": self._spool.disk_bytes(),
                "max_spool_bytes": self._spool.max_bytes})

    def _replay(self) -> None:
        """Send spooled records oldest first; stop at the first failure or after ~1s."""
        if not self._broker_reachable():
            self._mark_unhealthy()
            return
        budget_end = time.monotonic() + 1.0
        while time.monotonic() < budget_end:
            batch = self._spool.read_batch(self.max_batch)
            if batch is None:
                break
            failed = self._send(batch.records)
            delivered = failed[0] if failed else len(batch.records)
            if failed:
                # Acknowledge only the delivered prefix, so order is kept on the next try.
                self._spool.ack(batch.prefix(delivered))
                self._count("replayed", delivered)
                self._count("published", delivered)
                return
            self._spool.ack(batch)
            self._count("replayed", delivered)
            self._count("published", delivered)
            self._count("dropped", batch.corrupt)
            self._spill_queue()  # the new events go behind the spooled ones anyway
        if self._spool.empty() and not self._healthy:
            log.info("broker reachable again, spool drained", extra=self.stats())
            self._healthy = True
            self._backoff_s = 0.5

    def _spill_queue(self) -> None:
        """Move what is queued to the spool, oldest first, if the queue is half full: called on the
        drain thread between slices of a stalled ack wait, after each batch sent, and between
        replayed batches (where the queue would otherwise drain only one batch per second)."""
        if self._queue.maxsize <= 0 or self._queue.qsize() < max(1, self._queue.maxsize // 2):
            return  # unbounded, or not half full
        taken = []
        for _ in range(self._queue.qsize()):
            try:
                taken.append(self._queue.get_nowait())
            except queue.Empty:
                break
        records = [item for item in taken if item is not _HEARTBEAT]
        if self._counts["spilled"] == 0 or self._spill_logged_at < time.monotonic() - 10:
            self._spill_logged_at = time.monotonic()
            log.warning("publish queue half full (acks stalled, or slower than the offers): spilling it to the spool",
                        extra={"records": len(records), "queue_size": self._queue.maxsize})
        try:
            before = self._counts["spooled"]
            self._to_spool(records)
            self._count("spilled", self._counts["spooled"] - before)
        finally:
            for _ in taken:
                self._queue.task_done()

    def _spool_leftovers(self) -> None:
        """On close: keep whatever is still queued for the next run."""
        leftovers = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            self._queue.task_done()
            if item is not _HEARTBEAT:
                leftovers.append(item)
        self._to_spool(leftovers)

    # -- Kafka ------------------------------------------------------------------------

    def _send(self, records: list[Record]) -> list[int]:
        """Send and wait for the acks; returns the indices of records not acknowledged."""
        if not records:
            return []
        try:
            producer = self._ensure_producer()
        except (KafkaError, OSError, ValueError) as exc:
            self._mark_unhealthy(exc)
            return list(range(len(records)))
        futures = []
        try:
            for r in records:
                futures.append(producer.send(r.topic, value=r.value, key=r.key, partition=r.partition))
            self._await_acks(producer)
        except (KafkaError, OSError, ValueError) as exc:
            log.warning("kafka send failed", extra={"error": str(exc)})
        failed = [i for i, f in enumerate(futures) if not f.succeeded()]
        failed += range(len(futures), len(records))
        if failed:
            self._count("send_failures", len(failed))
            self._mark_unhealthy(_first_error(futures))
            # A fresh producer after a failure: the old one could still deliver
            # its abandoned batches later, duplicating what we now spool.
            self._drop_producer(graceful=False)
        return failed

    def _await_acks(self, producer: KafkaProducer) -> None:
        """``producer.flush(send_timeout_s)``, in slices between which the queue may be spilled."""
        deadline = time.monotonic() + self.send_timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                producer.flush(timeout=max(0.001, min(ACK_WAIT_SLICE_S, remaining)))
                return
            except KafkaTimeoutError:
                if remaining <= ACK_WAIT_SLICE_S:
                    raise
            self._spill_queue()

    def _ensure_producer(self) -> KafkaProducer:
        if self._producer is None:
            timeout_ms = int(self.send_timeout_s * 1000)
            self._producer = KafkaProducer(
                bootstrap_servers=self.kafka.bootstrap_servers,
                client_id=f"{self.kafka.client_id}-{self.instance_id}",
                acks="all", enable_idempotence=True, linger_ms=5,
                request_timeout_ms=max(1000, timeout_ms // 2), delivery_timeout_ms=timeout_ms,
                max_block_ms=max(1000, timeout_ms // 2), bootstrap_timeout_ms=max(1000, timeout_ms // 2),
                reconnect_backoff_max_ms=2000, allow_auto_create_topics=False,
                max_request_size=ENTRY_MESSAGE_MAX_BYTES,  # a cluster model on the entries topic
            )
        return self._producer

    def _drop_producer(self, graceful: bool) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            producer.close(timeout=2.0 if graceful else 0)
        except Exception as exc:  # closing a broken producer may fail in many ways
            log.debug("producer close failed", extra={"error": str(exc)})
            _force_close(producer)

    def _broker_reachable(self) -> bool:
        for server in self.kafka.bootstrap_servers.split(","):
            host, _, port = server.strip().rpartition(":")
            if port.isdigit() and port_open(host or "127.0.0.1", int(port), timeout=1.0):
                return True
        return False

    def _mark_unhealthy(self, error: object = None) -> None:
        if self._healthy:
            log.warning("kafka unavailable, spooling to disk", extra={"error": str(error or "")})
        self._healthy = False
        self._retry_at = time.monotonic() + self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, self.max_backoff_s)


def _first_error(futures: list) -> object:
    for f in futures:
        if f.is_done and f.failed():
            return f.exception
    return "not acknowledged in time"


def _force_close(producer: KafkaProducer) -> None:
    """Stop a producer whose close() gave up: kafka-python 3.0's close() flushes first and,
    on a flush timeout, returns without stopping its sender thread, which would then
    deliver the abandoned batches later (duplicating what was spooled)."""
    sender = getattr(producer, "_sender", None)
    if sender is not None:
        sender.force_close()
        sender.join(5)
    producer._closed = True  # so __del__ does not retry the failing flush
