"""The disk tier of a store: the long tail of its entries on local disk, so an arm can hold
more entries than its memory budget (``capacity_entries`` / ``capacity_bytes``).

When the memory tier must make room, its LRU victim is demoted here instead of dropped
(``Partition.evict_for``): the whole entry goes into a SQLite file under the store's data
directory (one file per store, ``Backends.disk_dir``), its vector as zstd-compressed float16
(~0.5 kB instead of 1.5 kB at 384 dimensions) and its metadata as zstd-compressed JSON. What
stays in memory per cold entry is a code under its row's ``seq`` (cache_core.store.cold_codes:
int8 in inverted lists, 384 B + an 8-byte id at 384 dimensions, float16 scanned in full while a
scope holds fewer than 2,496): no query or answer text, no float32 vector, no Python object.
The file maps entry ids to seqs (``entry_id UNIQUE``, ``seq`` its primary key) and is asked
for every id look-up; ``seq`` only grows, so the oldest demoted is the smallest.

A lookup searches both tiers (``Partition.search``); the codes' best ``CANDIDATES`` are read
back from the file (one query by primary key) and re-scored against their stored float16
vector (cosine within ~1e-3 of the float32 one), so a threshold meets (nearly) the true
cosine; those within the best ``SEARCH_K`` are then loaded whole. Served
from disk, an entry is promoted: taken out of the file and inserted into memory (which may demote
another). The tier that served each hit is in its event (``CacheEvent.tier``).

Lifetime on disk: an entry's expiry is fixed when it is demoted (no hit reaches it there, a hit
promotes it); expired rows are dropped by the sweeper and when met. Past ``capacity`` rows the
oldest demoted go first (truly evicted). Invalidations, purges and clears reach disk entries as
memory ones (``Partition.remove`` / ``remove_where``, ``Stores.take_namespace``).

Durability: the file survives a restart and is reopened (each scope's codes rebuilt from its
rows: at 10^6 that reads every row once); demotion removes the entry from the write-ahead log's view (a logged removal), so the
two never both restore it. Not thread-safe: the partition's lock is held around every call.

Growing: when a scope's codes call for twice the lists, a background thread reads a random sample
of its rows through a connection of its own and runs the new lists' k-means (FAISS releases the GIL),
while the old codes go on serving and taking demotions; the first demotion after it finished fills
the trained lists from the file and swaps them in. Inline, the last of those (1,024 lists on ~40,000
rows) held the partition's lock, and so every lookup of the store, for 5.7-17 s; the swap's fill
still does, ~1.3 s at 65,536 rows (bench.disk_tier_growth). ``train_in_background=False`` trains
inline (tests that count rebuilds; reopening always does).
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zstandard

from cache_core.records import CacheEntry
from cache_core.store.cold_codes import CANDIDATES, POINTS_PER_CENTROID, ColdCodes, nlist_for

ZSTD_LEVEL = 3
REBUILD_CHUNK = 16384
_META = ("entry_id", "query", "answer", "created_at", "ttl_s", "ttl_policy", "max_age_s", "namespace",
         "intent_cluster", "scope", "provenance_source", "provenance_version", "last_hit_at",
         "hit_count", "grace_s", "protected", "approx_bytes")


def file_for(directory: Path, key: tuple[str, str, str]) -> Path:
    return Path(directory) / ("tier-" + hashlib.sha256("\x1f".join(key).encode()).hexdigest()[:32] + ".sqlite")


class DiskTier:
    """One store's cold entries: rows in a SQLite file, codes in memory (one ``ColdCodes`` a scope)."""

    def __init__(self, path: Path, dim: int, capacity: int, train_in_background: bool = True):
        self.path = Path(path)
        self.dim = dim
        self.capacity = capacity
        self.train_in_background = train_in_background
        self._training: dict[str, tuple[threading.Thread, ColdCodes]] = {}
        """scope -> (the thread training its next lists, those lists), while one runs or waits to be used."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS cold (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
                         "entry_id TEXT UNIQUE NOT NULL, scope TEXT NOT NULL, expires_at REAL NOT NULL, "
                         "vec BLOB NOT NULL, meta BLOB NOT NULL)")
        self._db.execute("CREATE INDEX IF NOT EXISTS cold_expiry ON cold (expires_at)")
        self._zc, self._zd = zstandard.ZstdCompressor(level=ZSTD_LEVEL), zstandard.ZstdDecompressor()
        # scope -> codes under their row's seq. No per-entry Python object: the file maps
        # entry_id <-> seq (``entry_id UNIQUE``, ``seq`` its primary key).
        self._codes: dict[str, ColdCodes] = {}
        self.demotions = self.promotions = self.evictions = self.expirations = self.rebuilds = 0
        self._count = 0
        self._reopen()

    def __len__(self) -> int:
        return self._count

    def __contains__(self, entry_id: str) -> bool:
        return self._row_of(entry_id) is not None

    def memory_bytes(self) -> int:
        """Resident cost of the cold entries: their codes and 8-byte ids (cold_codes: int8 in
        inverted lists past 2,496 entries a scope, float16 below), no id mapping (the file's)."""
        return sum(codes.nbytes() for codes in self._codes.values())

    # -- writes -------------------------------------------------------------------------

    def put(self, entry: CacheEntry) -> None:
        """Demote ``entry`` (replacing a row of the same id); the oldest go past capacity."""
        self._demote(entry)
        self._evict_past_capacity()

    def put_many(self, entries: list[CacheEntry]) -> None:
        """``put`` each in one transaction (a bulk fill: one commit, not one per row; the
        codes are added one by one as ``put`` adds them)."""
        self._db.execute("BEGIN")
        try:
            for entry in entries:
                self._demote(entry)
        finally:
            self._db.execute("COMMIT")
        self._evict_past_capacity()

    def _demote(self, entry: CacheEntry) -> None:
        self.remove(entry.entry_id)
        vec = np.asarray(entry.embedding, dtype=np.float16).reshape(-1)
        meta = {name: getattr(entry, name) for name in _META}
        meta["wrong_units"] = sorted(entry.wrong_units)
        cur = self._db.execute("INSERT INTO cold (entry_id, scope, expires_at, vec, meta) VALUES (?, ?, ?, ?, ?)",
                               (entry.entry_id, entry.scope or "", entry.expires_at(),
                                self._zc.compress(vec.tobytes()), self._zc.compress(json.dumps(meta).encode())))
        self._index(cur.lastrowid, entry.scope or "", vec.astype(np.float32))
        self._count += 1
        self.demotions += 1

    def _evict_past_capacity(self) -> None:
        while self._count > self.capacity:  # seq only grows: the smallest is the oldest demoted
            oldest = self._db.execute("SELECT entry_id FROM cold ORDER BY seq LIMIT 1").fetchone()
            self.remove(oldest[0])
            self.evictions += 1

    def remove(self, entry_id: str) -> bool:
        found = self._row_of(entry_id)
        if found is None:
            return False
        seq, scope = found
        codes = self._codes[scope]
        codes.remove(seq)
        if codes.live == 0:
            del self._codes[scope]
        self._db.execute("DELETE FROM cold WHERE seq = ?", (seq,))
        self._count -= 1
        return True

    def take(self, entry_id: str) -> CacheEntry | None:
        """Promote: the entry, out of the tier (None if it is not here)."""
        entry = self.load(entry_id)
        if entry is not None:
            self.remove(entry_id)
            self.promotions += 1
        return entry

    def clear(self) -> None:
        self._db.execute("DELETE FROM cold")
        self._codes.clear()
        self._training.clear()  # lists trained on rows that are gone: a running thread's result is dropped
        self._count = 0

    def drop_expired(self, now: float) -> int:
        ids = [row[0] for row in self._db.execute("SELECT entry_id FROM cold WHERE expires_at <= ?", (now,))]
        for entry_id in ids:
            self.remove(entry_id)
        self.expirations += len(ids)
        return len(ids)

    def remove_where(self, matches: Callable[[CacheEntry], bool]) -> int:
        """Remove the rows whose entry ``matches`` (a purge: every row is read)."""
        doomed = [e.entry_id for e in self.entries() if matches(e)]
        for entry_id in doomed:
            self.remove(entry_id)
        return len(doomed)

    def close(self) -> None:
        self._db.close()

    # -- reads --------------------------------------------------------------------------

    def search(self, vec: np.ndarray, scope: str | None, k: int) -> list[tuple[str, float]]:
        """Top-k (entry_id, cosine) of ``scope``, best first (``candidates`` without the entries)."""
        return [(entry.entry_id, sim) for entry, sim in self.candidates(vec, scope, k)]

    def candidates(self, vec: np.ndarray, scope: str | None, k: int,
                   floor: float = -np.inf) -> list[tuple[CacheEntry, float]]:
        """Top-k (entry, cosine) of ``scope`` above ``floor``, best first: the codes' best
        ``CANDIDATES`` re-scored from their rows' float16 vectors, read with their metadata in
        one query by primary key (only the top k decoded into entries)."""
        codes = self._codes.get(scope or "")
        if codes is None or codes.live == 0 or k <= 0:
            return []
        seqs, _ = codes.search(vec, max(k, CANDIDATES))
        if not len(seqs):
            return []
        marks = ",".join("?" * len(seqs))
        rows = self._db.execute(f"SELECT vec, meta FROM cold WHERE seq IN ({marks})", seqs.tolist()).fetchall()
        if not rows:
            return []
        vecs = [self._vector(blob) for blob, _ in rows]
        scores = np.stack(vecs) @ np.asarray(vec, dtype=np.float32).reshape(-1)
        order = np.argsort(-scores, kind="stable")[:k]
        return [(self._entry(vecs[i], rows[i][1]), float(scores[i])) for i in order if scores[i] > floor]

    def load(self, entry_id: str) -> CacheEntry | None:
        row = self._db.execute("SELECT vec, meta FROM cold WHERE entry_id = ?", (entry_id,)).fetchone()
        return None if row is None else self._entry(*row)

    def entries(self) -> list[CacheEntry]:
        return [self._entry(vec, meta) for vec, meta in self._db.execute("SELECT vec, meta FROM cold")]

    # -- internals ----------------------------------------------------------------------

    def _vector(self, blob: bytes) -> np.ndarray:
        return _decoded(blob, self._zd)

    def _entry(self, vec: bytes | np.ndarray, meta_blob: bytes) -> CacheEntry:
        meta = json.loads(self._zd.decompress(meta_blob))
        wrong = frozenset(meta.pop("wrong_units", []))
        embedding = vec if isinstance(vec, np.ndarray) else self._vector(vec)
        return CacheEntry(embedding=embedding, wrong_units=wrong, **meta)

    def _row_of(self, entry_id: str) -> tuple[int, str] | None:
        """(seq, scope) of ``entry_id``'s row, by the file's unique index on ``entry_id``."""
        return self._db.execute("SELECT seq, scope FROM cold WHERE entry_id = ?", (entry_id,)).fetchone()

    def _index(self, seq: int, scope: str, vec: np.ndarray) -> None:
        codes = self._codes.get(scope)
        if codes is None:
            codes = self._codes[scope] = ColdCodes(self.dim)
        codes.add(np.array([seq], dtype=np.int64), vec)
        if codes.outgrown():
            self._grow(scope, codes.live)

    def _grow(self, scope: str, count: int) -> None:
        """More lists for ``scope``: trained on a background thread, swapped in by the first call
        after the training ended (module docstring); inline without ``train_in_background``."""
        if not self.train_in_background:
            self._rebuild(scope, count)
            return
        pending = self._training.get(scope)
        if pending is None:
            codes = ColdCodes(self.dim, nlist_for(count))
            trainer = threading.Thread(target=self._train_apart, args=(scope, codes),
                                       name="scache-disk-tier-train", daemon=True)
            self._training[scope] = (trainer, codes)
            trainer.start()
        elif not pending[0].is_alive():
            del self._training[scope]
            self._rebuild(scope, count, pending[1])  # untrained (the thread failed): trained here

    def _reopen(self) -> None:
        """Codes from the file's rows: a scope large enough for inverted lists rebuilt on its
        own (a pass over the file each: few scopes are), the small ones in one pass."""
        counts = dict(self._db.execute("SELECT scope, COUNT(*) FROM cold GROUP BY scope").fetchall())
        self._count = sum(counts.values())
        large = {scope for scope, count in counts.items() if nlist_for(count)}
        for scope in large:
            self._rebuild(scope, counts[scope])
        if len(large) < len(counts):
            for seq, scope, blob in self._db.execute("SELECT seq, scope, vec FROM cold"):
                if scope not in large:
                    self._codes.setdefault(scope, ColdCodes(self.dim)).add(np.array([seq]), self._vector(blob))

    def _train_apart(self, scope: str, codes: ColdCodes) -> None:
        """On the training thread: sample through a connection of its own (WAL: a reader never
        blocks the demotions) and its own decompressor, then the k-means."""
        db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        try:
            codes.train(_sample(db, scope, codes.nlist, zstandard.ZstdDecompressor()))
        finally:
            db.close()

    def _rebuild(self, scope: str, count: int, codes: ColdCodes | None = None) -> None:
        """``scope``'s codes anew from the file (``codes``: lists trained already; else the lists its
        size calls for, trained here on a random sample), filled in chunks (no float copy of all rows
        at once)."""
        codes = codes if codes is not None else ColdCodes(self.dim, nlist_for(count))
        if not codes.trained:
            codes.train(_sample(self._db, scope, codes.nlist, self._zd))
        self._codes.pop(scope, None)  # the old structure goes before the new one fills
        cursor = self._db.execute("SELECT seq, vec FROM cold WHERE scope = ?", (scope,))
        while chunk := cursor.fetchmany(REBUILD_CHUNK):
            codes.add(np.array([seq for seq, _ in chunk], dtype=np.int64),
                      np.stack([self._vector(blob) for _, blob in chunk]))
        codes.finish_bulk()
        if codes.live:
            self._codes[scope] = codes
        self.rebuilds += 1


def _decoded(blob: bytes, decompressor: zstandard.ZstdDecompressor) -> np.ndarray:
    return np.frombuffer(decompressor.decompress(blob), dtype=np.float16).astype(np.float32)


def _sample(db: sqlite3.Connection, scope: str, nlist: int, decompressor) -> np.ndarray:
    """A random sample of ``scope``'s vectors in ``db``, enough to train ``nlist`` lists."""
    rows = db.execute("SELECT vec FROM cold WHERE scope = ? ORDER BY random() LIMIT ?",
                      (scope, POINTS_PER_CENTROID * max(nlist, 1))).fetchall()
    return np.stack([_decoded(blob, decompressor) for (blob,) in rows])
