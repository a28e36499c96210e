"""A bounded, append-only on-disk queue of Kafka records, for when the broker is away.

Layout of the spool directory:
- ``seg-<n>.jsonl``: segments, one JSON record per line, appended and fsync'd per batch;
- ``cursor.json``: how far the oldest segment has been acknowledged (segment name, byte offset),
  replaced atomically, so a restarted process resumes where the last one stopped;
- ``.lock``: an exclusive flock, so two processes never share one spool.

A segment that has been fully acknowledged is deleted. A torn last line (a crash in the
middle of a write) is cut off on open. Delivery is at least once: a batch that was sent
but not yet acknowledged in the cursor when the process died is sent again.

Not thread-safe: one thread (the publisher's drain thread) owns a Spool.
"""
from __future__ import annotations

import base64
import fcntl
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from cache_core.durable import fsync_dir

log = logging.getLogger(__name__)

SEGMENT_PREFIX = "seg-"
SEGMENT_SUFFIX = ".jsonl"
CURSOR_FILE = "cursor.json"


@dataclass(frozen=True)
class Record:
    """One Kafka message waiting to be sent (partition None: chosen by key)."""

    topic: str
    key: bytes
    value: bytes
    partition: int | None = None

    def to_line(self) -> bytes:
        doc = {"t": self.topic, "k": base64.b64encode(self.key).decode(),
               "v": self.value.decode(), "p": self.partition}
        return json.dumps(doc, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> Record:
        doc = json.loads(line)
        return cls(topic=doc["t"], key=base64.b64decode(doc["k"]), value=doc["v"].encode(),
                   partition=doc.get("p"))


@dataclass(frozen=True)
class Batch:
    """Records read from the head segment, and the position that acknowledges them."""

    records: list[Record]
    segment: str
    end_offset: int
    corrupt: int = 0
    """Unreadable lines skipped inside this batch's range (lost, to be counted)."""
    start_offset: int = 0
    record_ends: tuple[int, ...] = ()
    """Byte offset just after each record, to acknowledge a delivered prefix."""

    def prefix(self, n: int) -> Batch:
        """The first ``n`` records (for acknowledging a partly delivered batch)."""
        if n >= len(self.records):
            return self
        end = self.record_ends[n - 1] if n > 0 else self.start_offset
        return Batch(records=self.records[:n], segment=self.segment, end_offset=end,
                     start_offset=self.start_offset, record_ends=self.record_ends[:n])


class SpoolLocked(RuntimeError):
    pass


class Spool:
    """Bounded on-disk FIFO of records; ``append`` refuses what would exceed ``max_bytes``."""

    def __init__(self, directory: Path, max_bytes: int, segment_bytes: int = 8 * 1024 * 1024):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = max(1, min(segment_bytes, max_bytes // 4 or 1))
        self._lock = self._acquire_lock()
        self._writer = None
        self._repair_tail()
        self._cursor = self._read_cursor()
        self._pending_bytes = self._compute_pending_bytes()
        self._disk_bytes = sum(p.stat().st_size for p in self.segments())
        self._writer_size = 0

    # -- state -----------------------------------------------------------------------

    def segments(self) -> list[Path]:
        """Segment files, oldest first."""
        return sorted(self.directory.glob(f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}"))

    def disk_bytes(self) -> int:
        """Bytes of all segment files, acknowledged prefix included (what the bound limits)."""
        return self._disk_bytes

    @property
    def pending_bytes(self) -> int:
        """Bytes of records not yet acknowledged."""
        return self._pending_bytes

    def empty(self) -> bool:
        return self._pending_bytes == 0

    # -- writing ---------------------------------------------------------------------

    def append(self, records: list[Record]) -> int:
        """Append records in order, fsync once; returns how many fit (a prefix of them)."""
        written = 0
        for record in records:
            line = record.to_line()
            if self._disk_bytes + len(line) > self.max_bytes:
                break
            writer = self._writable(len(line))
            writer.write(line)
            self._writer_size += len(line)
            self._disk_bytes += len(line)
            self._pending_bytes += len(line)
            written += 1
        if self._writer is not None and written:
            self._writer.flush()
            os.fsync(self._writer.fileno())
        return written

    def _writable(self, incoming: int):
        # Each process writes to segments of its own, after any left by an earlier one.
        if self._writer is None or (
                self._writer_size > 0 and self._writer_size + incoming > self.segment_bytes):
            self._open_new_segment()
        return self._writer

    def _open_new_segment(self) -> None:
        if self._writer is not None:
            self._writer.close()
        segs = self.segments()
        last = int(segs[-1].name[len(SEGMENT_PREFIX):-len(SEGMENT_SUFFIX)]) if segs else 0
        path = self.directory / f"{SEGMENT_PREFIX}{last + 1:012d}{SEGMENT_SUFFIX}"
        self._writer = open(path, "ab")
        self._writer_size = 0
        fsync_dir(self.directory)

    # -- reading and acknowledging ---------------------------------------------------

    def read_batch(self, max_records: int) -> Batch | None:
        """The next unacknowledged records of the oldest segment (None when empty)."""
        segs = self.segments()
        while segs:
            head = segs[0]
            offset = self._cursor[1] if self._cursor[0] == head.name else 0
            if offset < head.stat().st_size:
                return self._read_from(head, offset, max_records)
            if len(segs) == 1:
                return None  # the head is the segment being written, all acknowledged
            self._delete_segment(head)
            segs = segs[1:]
        return None

    def _read_from(self, head: Path, offset: int, max_records: int) -> Batch:
        records, ends, corrupt, end = [], [], 0, offset
        with open(head, "rb") as f:
            f.seek(offset)
            while len(records) < max_records:
                line = f.readline()
                if not line.endswith(b"\n"):
                    break  # end of segment (a torn tail was cut off on open)
                end += len(line)
                try:
                    records.append(Record.from_line(line))
                    ends.append(end)
                except (ValueError, KeyError, TypeError):
                    corrupt += 1
                    log.error("skipping unreadable spool line", extra={"segment": head.name})
        return Batch(records=records, segment=head.name, end_offset=end, corrupt=corrupt,
                     start_offset=offset, record_ends=tuple(ends))

    def ack(self, batch: Batch) -> None:
        """Mark a batch as delivered; delete its segment once fully delivered."""
        prev = self._cursor[1] if self._cursor[0] == batch.segment else 0
        self._pending_bytes = max(0, self._pending_bytes - (batch.end_offset - prev))
        head = self.directory / batch.segment
        if batch.end_offset >= head.stat().st_size:
            self._delete_segment(head)
        else:
            self._write_cursor((batch.segment, batch.end_offset))

    def _delete_segment(self, path: Path) -> None:
        if self._writer is not None and Path(self._writer.name) == path:
            self._writer.close()
            self._writer = None
        if path.exists():
            self._disk_bytes -= path.stat().st_size
            path.unlink()
        self._write_cursor(("", 0))

    # -- persistence helpers ---------------------------------------------------------

    def _read_cursor(self) -> tuple[str, int]:
        try:
            doc = json.loads((self.directory / CURSOR_FILE).read_text())
            return str(doc["segment"]), int(doc["offset"])
        except (OSError, ValueError, KeyError, TypeError):
            return "", 0

    def _write_cursor(self, cursor: tuple[str, int]) -> None:
        self._cursor = cursor
        tmp = self.directory / (CURSOR_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"segment": cursor[0], "offset": cursor[1]}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.directory / CURSOR_FILE)

    def _compute_pending_bytes(self) -> int:
        total = 0
        for seg in self.segments():
            size = seg.stat().st_size
            total += size - (min(self._cursor[1], size) if self._cursor[0] == seg.name else 0)
        return total

    def _repair_tail(self) -> None:
        """Cut a partial last line left by a crash mid-write."""
        segs = self.segments()
        if not segs:
            return
        last = segs[-1]
        data = last.read_bytes()
        keep = data.rfind(b"\n") + 1
        if keep < len(data):
            log.warning("truncating torn spool tail", extra={"segment": last.name,
                                                            "bytes": len(data) - keep})
            with open(last, "r+b") as f:
                f.truncate(keep)
                os.fsync(f.fileno())

    def _acquire_lock(self):
        handle = open(self.directory / ".lock", "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise SpoolLocked(f"spool {self.directory} is in use by another process") from None
        return handle

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None
