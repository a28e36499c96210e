"""How an entry and its vector are written down: the same fields for the snapshot, the
log (cache_core.state.persistence) and the entries topic (cache_core.state.replication),
and a vector as base64 little-endian float32 (also the intent clusters' centroids).
A leaf module: it imports only the record types.
"""
from __future__ import annotations

import base64

import numpy as np

from cache_core.records import CacheEntry

_ENTRY_FIELDS = ("entry_id", "query", "answer", "created_at", "ttl_s", "ttl_policy", "max_age_s",
                 "namespace", "intent_cluster", "scope", "provenance_source", "provenance_version",
                 "last_hit_at", "hit_count", "grace_s", "protected", "approx_bytes")


def entry_meta(entry) -> dict:
    """The fields an entry is replicated with (a put on the entries topic)."""
    return {name: getattr(entry, name) for name in _ENTRY_FIELDS}


def persisted_meta(entry) -> dict:
    """``entry_meta`` plus its ``wrong_units`` when it has any: kept on disk, but not sent in a
    put, whose fields a replica that predates them would refuse (an unknown field is malformed)."""
    meta = entry_meta(entry)
    if entry.wrong_units:
        meta["wrong_units"] = sorted(entry.wrong_units)
    return meta


def entry_from_meta(meta: dict, embedding: np.ndarray):
    meta = dict(meta)
    wrong_units = frozenset(meta.pop("wrong_units", None) or ())  # absent before votes were persisted
    if not all(isinstance(unit, str) for unit in wrong_units):
        raise ValueError("wrong_units must be unit ids")  # a corrupt snapshot: PersistenceError, a put: malformed
    return CacheEntry(embedding=np.asarray(embedding, dtype=np.float32), wrong_units=wrong_units, **meta)


def encode_vec(vec: np.ndarray) -> str:
    return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode()


def decode_vec(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f4").astype(np.float32)
