"""Admission tiers (DESIGN.md): whether an offered answer is stored, and how.

By the new query's similarity to its nearest live entry in the same store and scope.
Our reading:
  * >= 0.85 ("near_duplicate"): a popular intent. Admit, with its eviction
    delayed: lifetime ttl + 30 s, and LRU skips it while it is alive.
  * 0.60-0.85 ("admitted"): admit under ordinary LRU (evicting if full).
  * < 0.60 ("novel"): a query unlike anything cached is most likely a one-off.
    It never pushes out a live entry: it is admitted only if there is room,
    after the eviction it triggers (expired entries at the LRU end are
    dropped); otherwise it is rejected ("novel_under_pressure"). An empty
    store admits anything, so a cold cache can fill.
The same query text in the same store and scope replaces the entry ("updated"); an entry
larger than the store is refused ("too_large"). Callers hold the partition's lock.
"""
from __future__ import annotations

import uuid

import numpy as np

from cache_core.experiments import ArmConfig
from cache_core.lifetime import ttl_for
from cache_core.store.partition import Partition
from cache_core.records import CacheEntry, StoreItem, StoreResult, entry_bytes

NEAR_DUPLICATE_SIM = 0.85
NOVEL_SIM = 0.60
EVICTION_GRACE_S = 30.0


def new_entry(item: StoreItem, arm: ArmConfig, vec: np.ndarray, cluster: int, now: float,
              default_ttl_s: float | None) -> CacheEntry:
    """The entry ``item`` would be stored as in ``arm``'s store."""
    vec = vec.copy()
    return CacheEntry(
        entry_id=uuid.uuid4().hex, query=item.query, embedding=vec, answer=item.answer, created_at=now,
        ttl_s=ttl_for(arm, item.ttl_s, default_ttl_s), ttl_policy=arm.ttl_policy, max_age_s=arm.max_age_s,
        namespace=item.namespace, intent_cluster=cluster, scope=item.scope,
        provenance_source=item.provenance_source, provenance_version=item.provenance_version,
        approx_bytes=entry_bytes(item.query, item.answer, vec),
    )


def admit(partition: Partition, entry: CacheEntry, result: StoreResult, now: float) -> StoreResult:
    """Store ``entry`` in ``partition`` if its tier allows; ``result`` is filled in and returned."""
    if entry.approx_bytes > partition.capacity_bytes:
        result.reason = "too_large"
        return result
    same = partition.existing_same_text(entry.scope, entry.query)
    if same is not None:
        partition.remove(same.entry_id)
        return _insert(partition, entry, result, "updated", 1.0, now)
    nearest = partition.nearest_alive(entry.embedding, entry.scope, now)
    similarity = nearest.similarity if nearest else None
    result.similarity = similarity
    if similarity is not None and similarity >= NEAR_DUPLICATE_SIM:
        entry.grace_s, entry.protected = EVICTION_GRACE_S, True
        return _insert(partition, entry, result, "near_duplicate", similarity, now)
    if similarity is not None and similarity < NOVEL_SIM and partition.disk is None:
        # with a disk tier the memory's LRU entry is demoted, not lost: no pressure to refuse under
        if not partition.has_room(entry.approx_bytes):
            partition.drop_expired_lru(now)
        if not partition.has_room(entry.approx_bytes):
            result.reason = "novel_under_pressure"
            return result
    return _insert(partition, entry, result, "admitted", similarity, now)


def _insert(partition: Partition, entry: CacheEntry, result: StoreResult, reason: str,
            similarity: float | None, now: float) -> StoreResult:
    partition.evict_for(entry.approx_bytes, now)
    partition.insert(entry)
    result.stored, result.reason, result.entry_id = True, reason, entry.entry_id
    result.similarity = similarity
    return result
