"""Durable cache state: a write-ahead log of entry changes plus periodic snapshots.

Layout under the snapshot directory (one process owns it; an flock enforces that):

* ``wal-00000007.log`` — log segments. One record per line,
  ``<crc32 hex> <json>``: ``put`` (partition key, entry metadata, embedding as
  base64 float32), ``remove`` (key, entry id), ``clear`` (namespace) or ``vote``
  (key, entry id, unit: a "wrong" verdict counted toward the entry's removal,
  cache_core.state.feedback) or ``judged`` (a verdict an error-bounded arm learns its
  thresholds from, cache_core.decision.error_bound).
* ``snap-00000007/`` — a snapshot: ``entries.npy`` (n x dim float32),
  ``entries.json`` (partition key + metadata per row, in LRU order, with the
  units that said "wrong" of it, ``wrong_units``, when there are any) and the
  intent clusters (``clusters.npy`` / ``clusters.json``) and the verdicts error-bounded arms
  learn from (``verdicts.json``: bounded windows per arm, cluster and entry).
* ``CURRENT`` — names the latest complete snapshot and the first log segment
  that must be replayed after it (written by atomic rename).

Durability contract: a store is acknowledged only after its ``put`` record is
written *and fsynced* (``Journal.sync`` before the HTTP response). Removals
(expiry, eviction) are written but not fsynced: the OS keeps them across a
process crash, and losing one to a power cut only brings back an entry that
expiry or eviction removes again. Namespace clears are fsynced. Votes are written
and become durable with the next sync (a store, a removal by feedback, or the
entries follower's offsets, which never move past what the log holds durably).

Snapshot: rotate to a new log segment, copy every partition under its lock,
write the files to a temporary directory, fsync, rename, switch ``CURRENT``, then
delete older segments and snapshots. Records in the new segment may already be
in the snapshot; replay is idempotent (a put replaces the entry with that id, a
remove of a missing id is a no-op, a vote adds a unit to a set), so that is harmless.
A snapshot or log from before votes were persisted has no ``wrong_units`` and no
vote records: its entries load with none.

Restore: load the snapshot, replay the segments from ``CURRENT`` on (a torn
last line — a write that was never acknowledged — ends its segment), drop
entries that expired meanwhile, rebuild the indexes, and log to a fresh segment.
Not persisted: hit counts and sliding-TTL renewals made since the last snapshot.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cache_core.durable import fsync_dir, replace_durably
from cache_core.decision.error_bound import Judged
from cache_core.state.changes import Clear, Put, Remove, Vote
from cache_core.state.codec import decode_vec, encode_vec, entry_from_meta, persisted_meta

log = logging.getLogger(__name__)

CURRENT = "CURRENT"
LOCK_FILE = "LOCK"


class PersistenceError(RuntimeError):
    """The snapshot directory cannot be used (locked by another process, unreadable)."""


def _line(record: dict) -> bytes:
    body = json.dumps(record, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _parse(line: bytes) -> dict | None:
    """The record, or None for a torn / corrupt line."""
    if not line.endswith(b"\n") or len(line) < 10:
        return None
    crc, _, body = line[:-1].partition(b" ")
    try:
        if int(crc, 16) != zlib.crc32(body):
            return None
        return json.loads(body)
    except (ValueError, json.JSONDecodeError):
        return None


def _segment_path(directory: Path, seq: int) -> Path:
    return directory / f"wal-{seq:08d}.log"


def _segments(directory: Path) -> list[tuple[int, Path]]:
    out = []
    for path in directory.glob("wal-*.log"):
        try:
            out.append((int(path.stem.split("-")[1]), path))
        except ValueError:
            continue
    return sorted(out)


# -- the log ----------------------------------------------------------------------------

@dataclass
class JournalStats:
    records: int = 0
    records_since_snapshot: int = 0
    bytes_since_snapshot: int = 0
    fsyncs: int = 0
    fsync_seconds_total: float = 0.0
    fsync_seconds_max: float = 0.0
    segment: int = 0


class Journal:
    """Appends records to the current log segment; ``sync`` makes them durable.

    ``record_*`` are called by partitions under their own lock: they only write
    (one syscall). ``sync`` fsyncs whatever was written since the last sync, so
    concurrent stores share one fsync (group commit)."""

    def __init__(self, directory: Path, segment: int, fsync: bool = True):
        self.directory = directory
        self.fsync_enabled = fsync
        self.stats = JournalStats(segment=segment)
        self._lock = threading.Lock()
        self._file = open(_segment_path(directory, segment), "ab", buffering=0)
        self._unsynced = False

    def record_put(self, key: tuple[str, str, str], entry) -> None:
        self._append({"op": "put", "key": list(key), "entry": persisted_meta(entry),
                      "vec": encode_vec(entry.embedding)})

    def record_remove(self, key: tuple[str, str, str], entry_id: str) -> None:
        self._append({"op": "remove", "key": list(key), "id": entry_id})

    def record_clear(self, namespace: str) -> None:
        self._append({"op": "clear", "namespace": namespace})

    def record_vote(self, key: tuple[str, str, str], entry_id: str, unit_id: str) -> None:
        self._append({"op": "vote", "key": list(key), "id": entry_id, "unit": unit_id})

    def record_judged(self, judged: Judged) -> None:
        self._append({"op": "judged", "exp": judged.experiment_id, "arm": judged.arm, "id": judged.entry_id,
                      "cluster": judged.cluster, "sim": judged.similarity, "wrong": judged.wrong,
                      "p": judged.check_prob, "audit": None if judged.audit is None else list(judged.audit)})

    def sync(self) -> None:
        """fsync the current segment if anything was written since the last sync."""
        with self._lock:
            if not self._unsynced:
                return
            self._unsynced = False
            started = time.perf_counter()
            if self.fsync_enabled:
                os.fsync(self._file.fileno())
            elapsed = time.perf_counter() - started
        self.stats.fsyncs += 1
        self.stats.fsync_seconds_total += elapsed
        self.stats.fsync_seconds_max = max(self.stats.fsync_seconds_max, elapsed)

    def rotate(self) -> int:
        """Close the current segment (durably) and start the next; returns its number."""
        with self._lock:
            os.fsync(self._file.fileno())
            self._file.close()
            self.stats.segment += 1
            self._file = open(_segment_path(self.directory, self.stats.segment), "ab", buffering=0)
            self._unsynced = False
            fsync_dir(self.directory)
            return self.stats.segment

    def snapshot_taken(self) -> None:
        self.stats.records_since_snapshot = 0
        self.stats.bytes_since_snapshot = 0

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                os.fsync(self._file.fileno())
                self._file.close()

    def _append(self, record: dict) -> None:
        line = _line(record)
        with self._lock:
            self._file.write(line)
            self._unsynced = True
        self.stats.records += 1
        self.stats.records_since_snapshot += 1
        self.stats.bytes_since_snapshot += len(line)


# -- snapshots, restore, background thread ----------------------------------------------

@dataclass
class RestoreReport:
    snapshot: str | None = None
    snapshot_entries: int = 0
    replayed_records: int = 0
    torn_records: int = 0
    expired_dropped: int = 0
    entries: int = 0
    seconds: float = 0.0


@dataclass
class SnapshotStats:
    snapshots: int = 0
    last_snapshot_at: float | None = None
    last_snapshot_seconds: float = 0.0
    last_snapshot_entries: int = 0
    restore: RestoreReport = field(default_factory=RestoreReport)


class Persistence:
    """Owns a snapshot directory for one cache: ``open`` restores and attaches the log."""

    def __init__(self, directory: Path, *, fsync: bool = True, interval_s: float = 300.0,
                 max_log_records: int = 50_000):
        self.directory = Path(directory)
        self.fsync = fsync
        self.interval_s = interval_s
        self.max_log_records = max_log_records
        self.stats = SnapshotStats()
        self.journal: Journal | None = None
        self._cache = None
        self._lock_fd: int | None = None
        self._snapshot_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def open(self, cache) -> RestoreReport:
        """Lock the directory, restore ``cache`` from it and start logging its changes."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        self._cache = cache
        try:
            report = self._restore(cache)
        except (OSError, ValueError, KeyError) as exc:  # unreadable snapshot or log
            os.close(self._lock_fd)
            self._lock_fd = None
            raise PersistenceError(f"cannot restore from {self.directory}: {exc!r}; move the "
                                   "directory aside to start empty") from exc
        next_segment = max([s for s, _ in _segments(self.directory)], default=0) + 1
        self.journal = Journal(self.directory, next_segment, fsync=self.fsync)
        cache.attach_journal(self.journal)
        self.stats.restore = report
        log.info("cache restored", extra={"dir": str(self.directory), **report.__dict__})
        return report

    def start(self) -> None:
        """Snapshot in the background every ``interval_s`` or when the log grows long."""
        self._thread = threading.Thread(target=self._run, name="scache-snapshots", daemon=True)
        self._thread.start()

    def close(self, final_snapshot: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.journal is not None:
            if final_snapshot:
                try:
                    self.snapshot()
                except OSError:
                    log.exception("final snapshot failed; the log still has every change")
            self.journal.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def metrics(self) -> dict:
        journal = self.journal.stats if self.journal else JournalStats()
        return {"log_records": journal.records, "log_records_since_snapshot": journal.records_since_snapshot,
                "log_bytes_since_snapshot": journal.bytes_since_snapshot, "log_segment": journal.segment,
                "fsyncs": journal.fsyncs, "fsync_seconds_total": journal.fsync_seconds_total,
                "fsync_seconds_max": journal.fsync_seconds_max, "snapshots": self.stats.snapshots,
                "last_snapshot_at": self.stats.last_snapshot_at or 0.0,
                "last_snapshot_seconds": self.stats.last_snapshot_seconds,
                "last_snapshot_entries": self.stats.last_snapshot_entries,
                "restored_entries": self.stats.restore.entries,
                "restore_seconds": self.stats.restore.seconds,
                "restore_torn_records": self.stats.restore.torn_records}

    # -- snapshot -----------------------------------------------------------------------

    def snapshot(self) -> Path:
        """Write a complete snapshot and truncate the log before it; returns its directory."""
        if self.journal is None or self._cache is None:
            raise PersistenceError("persistence is not open")
        with self._snapshot_lock:
            started = time.perf_counter()
            segment = self.journal.rotate()
            keys, metas, vecs = self._capture(self._cache)
            target = self.directory / f"snap-{segment:08d}"
            self._write_snapshot(target, keys, metas, vecs, self._cache)
            self._switch_current(target.name, segment)
            self.journal.snapshot_taken()
            self._delete_before(segment, keep=target.name)
            self.stats.snapshots += 1
            self.stats.last_snapshot_at = self._cache.clock()
            self.stats.last_snapshot_seconds = time.perf_counter() - started
            self.stats.last_snapshot_entries = len(metas)
            log.info("cache snapshot written", extra={"snapshot": target.name, "entries": len(metas),
                                                      "seconds": self.stats.last_snapshot_seconds})
            return target

    @staticmethod
    def _capture(cache) -> tuple[list, list, list]:
        keys, metas, vecs = [], [], []
        for partition in cache.partitions():
            with partition.lock:
                entries = list(partition.entries.values())  # LRU order: least recent first
                keys.extend(list(partition.key) for _ in entries)
                metas.extend(persisted_meta(entry) for entry in entries)
                vecs.extend(partition.vectors_of(entries))  # a compact entry's from its store
        return keys, metas, vecs

    def _write_snapshot(self, target: Path, keys, metas, vecs, cache) -> None:
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        matrix = np.vstack(vecs).astype(np.float32) if vecs else np.zeros((0, cache.embedder.dim),
                                                                           np.float32)
        self._write(tmp / "entries.npy", lambda f: np.save(f, matrix))
        self._write(tmp / "entries.json", lambda f: f.write(json.dumps(
            [{"key": k, "entry": m} for k, m in zip(keys, metas)]).encode()))
        state = cache.clusters.export_state()
        self._write(tmp / "clusters.npy", lambda f: np.save(f, state.pop("centroids")))
        self._write(tmp / "clusters.json", lambda f: f.write(json.dumps(state).encode()))
        verdicts = cache.hit_rule.verdicts.export_state()
        self._write(tmp / "verdicts.json", lambda f: f.write(json.dumps(verdicts, separators=(",", ":")).encode()))
        fsync_dir(tmp)
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
        fsync_dir(self.directory)

    @staticmethod
    def _write(path: Path, write) -> None:
        with open(path, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())

    def _switch_current(self, name: str, segment: int) -> None:
        replace_durably(self.directory / CURRENT, json.dumps({"snapshot": name, "log_from": segment}).encode())

    def _delete_before(self, segment: int, keep: str) -> None:
        for seq, path in _segments(self.directory):
            if seq < segment:
                path.unlink(missing_ok=True)
        for old in self.directory.glob("snap-*"):
            if old.name != keep:
                shutil.rmtree(old, ignore_errors=True)

    # -- restore ------------------------------------------------------------------------

    def _restore(self, cache) -> RestoreReport:
        started = time.perf_counter()
        report = RestoreReport()
        log_from = 0
        current = self.directory / CURRENT
        if current.exists():
            pointer = json.loads(current.read_text())
            report.snapshot, log_from = pointer["snapshot"], int(pointer["log_from"])
            report.snapshot_entries = self._load_snapshot(self.directory / report.snapshot, cache)
        for seq, path in _segments(self.directory):
            if seq >= log_from:
                self._replay(path, cache, report)
        report.expired_dropped = cache.drop_expired()
        report.entries = sum(len(p) for p in cache.partitions())
        report.seconds = time.perf_counter() - started
        return report

    @staticmethod
    def _load_snapshot(snap: Path, cache) -> int:
        vecs = np.load(snap / "entries.npy")
        rows = json.loads((snap / "entries.json").read_text())
        for row, vec in zip(rows, vecs):
            cache.apply(Put(tuple(row["key"]), entry_from_meta(row["entry"], vec)), "log")
        clusters_json = snap / "clusters.json"
        if clusters_json.exists():
            state = json.loads(clusters_json.read_text())
            state["centroids"] = np.load(snap / "clusters.npy")
            cache.clusters.load_state(state)
        verdicts_json = snap / "verdicts.json"  # absent in snapshots from before error-bounded arms
        if verdicts_json.exists():
            try:
                cache.hit_rule.verdicts.load_state(json.loads(verdicts_json.read_text()))
            except (TypeError, AttributeError) as exc:  # KeyError / ValueError: PersistenceError as the rest
                raise ValueError(f"verdicts.json: {exc}") from exc
        return len(rows)

    @staticmethod
    def _replay(path: Path, cache, report: RestoreReport) -> None:
        with open(path, "rb") as f:
            for line in f:
                record = _parse(line)
                if record is None:
                    # Only the last write can be torn (nothing after it was acknowledged).
                    report.torn_records += 1
                    log.warning("torn log record ignored", extra={"segment": path.name})
                    break
                op = record["op"]
                if op == "put":
                    cache.apply(Put(tuple(record["key"]),
                                    entry_from_meta(record["entry"], decode_vec(record["vec"]))), "log")
                elif op == "remove":
                    cache.apply(Remove(tuple(record["key"]), record["id"]), "log")
                elif op == "clear":
                    cache.apply(Clear(record["namespace"]), "log")
                elif op == "vote":
                    cache.apply(Vote(tuple(record["key"]), record["id"], record["unit"]), "log")
                elif op == "judged":
                    audit = record.get("audit")  # logs before the audit's reading: measured again
                    cache.apply(Judged(record["exp"], record["arm"], record["id"], int(record["cluster"]),
                                       float(record["sim"]), bool(record["wrong"]),
                                       float(record.get("p", 1.0)),  # logs before check_prob: 1
                                       None if audit is None else tuple(float(x) for x in audit)), "log")
                report.replayed_records += 1

    # -- internals ----------------------------------------------------------------------

    def _take_lock(self) -> None:
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise PersistenceError(f"snapshot dir {self.directory} is in use by another cache "
                                   "process; give each instance its own SCACHE_CACHE__SNAPSHOT_DIR"
                                   ) from exc
        self._lock_fd = fd

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(min(1.0, self.interval_s)):
            due = time.monotonic() - last >= self.interval_s
            long_log = (self.journal is not None
                        and self.journal.stats.records_since_snapshot >= self.max_log_records)
            changed = self.journal is not None and self.journal.stats.records_since_snapshot > 0
            if not changed or not (due or long_log):
                continue
            try:
                self.snapshot()
            except Exception:  # keep serving: the log still holds everything
                log.exception("snapshot failed")
            last = time.monotonic()
