"""Stores: the cache's partitions by key, made on first use and laid out as the
experiment in force says.

Keys. ``partitioned`` experiments give every arm its own store (namespace, experiment,
arm), so arms never serve each other's entries and their hit rates are independent;
``shared`` experiments give all arms one store (namespace, experiment, ``SHARED_ARM``)
and differ only in how they decide. A shared store follows its experiment's first arm
for index structure and the largest capacity of its arms, since every arm fills it.

Inside a store, entries with a conversation ``scope`` live in an index of their own per
scope (cache_core.store.partition): a scoped lookup searches only its scope (a follow-up
such as "what about it?" depends on its conversation, so neither another conversation's
entries nor global ones may answer it); an unscoped lookup searches only unscoped entries.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from cache_core.experiments import ArmConfig, ExperimentConfig
from cache_core.registry import ExperimentRegistry, UnknownExperiment
from cache_core.store.factory import Backends, discard
from cache_core.store.faiss import IndexSpec
from cache_core.store.partition import Partition
from cache_core.records import CacheEntry

SHARED_ARM = "*"

Key = tuple[str, str, str]
"""(namespace, experiment id, arm name or SHARED_ARM)"""


class Stores:
    def __init__(self, dim: int, registry: ExperimentRegistry, backends: Backends | None = None):
        self.dim = dim
        self.registry = registry
        self.backends = backends
        """Where out-of-process index kinds keep their vectors (cache_core.store.factory)."""
        self.journal = None
        """Given to every partition (cache_core.state.persistence.Journal): told of every change."""
        self._by_key: dict[Key, Partition] = {}
        self._lock = threading.Lock()
        self._idle_marks: dict[Key, int] = {}  # mutations at the last retire_idle

    def for_arm(self, namespace: str, experiment: ExperimentConfig, arm: ArmConfig) -> Partition:
        """The store ``arm``'s requests read and write, aligned to ``experiment``'s layout."""
        shared = experiment.partition_mode == "shared"
        key = (namespace, experiment.experiment_id, SHARED_ARM if shared else arm.name)
        known = self._by_key.get(key)
        if known is not None and known.applied is experiment:
            return known  # aligned to this very snapshot already: no lock, no rebuild check
        layout = experiment.arms[0] if shared else arm
        arms = experiment.arms if shared else [arm]
        spec = IndexSpec.for_arm(layout)
        cap_entries = max(a.capacity_entries for a in arms)
        cap_bytes = max(a.capacity_bytes for a in arms)
        disk_entries = max(a.disk_entries for a in arms)
        with self._lock:
            partition = self._by_key.get(key)
            if partition is None:
                partition = self._by_key[key] = self._new(key, spec, cap_entries, cap_bytes)
        with partition.lock:
            partition.reconfigure(spec, cap_entries, cap_bytes, disk_entries)
            partition.applied = experiment
        return partition

    def for_key(self, key: Key) -> Partition:
        """The store of a persisted or replicated key; its layout follows the experiment in
        force if it is still configured (``for_arm`` re-aligns it on the next request)."""
        with self._lock:
            partition = self._by_key.get(key)
            if partition is not None:
                return partition
        _namespace, experiment_id, arm_key = key
        try:
            experiment = self.registry.get(experiment_id)
            arm = experiment.arms[0] if arm_key == SHARED_ARM else experiment.arm(arm_key)
        except (KeyError, UnknownExperiment):
            arm = ArmConfig(name="restored")
        with self._lock:
            if key not in self._by_key:
                self._by_key[key] = self._new(key, IndexSpec.for_arm(arm), arm.capacity_entries,
                                              arm.capacity_bytes)
            return self._by_key[key]

    def get(self, key: Key) -> Partition | None:
        return self._by_key.get(key)

    def partition_for(self, namespace: str, experiment_id: str, arm: str) -> Partition | None:
        """The store a (namespace, experiment, arm) reads from, if it exists yet."""
        experiment = self.registry.get(experiment_id)
        arm_key = SHARED_ARM if experiment.partition_mode == "shared" else arm
        return self._by_key.get((namespace, experiment_id, arm_key))

    def all(self) -> list[Partition]:
        with self._lock:
            return list(self._by_key.values())

    @contextmanager
    def live(self, get: Callable[[], Partition]) -> Iterator[Partition]:
        """``get()``'s partition with its lock held. One that a clear or ``retire_idle`` took
        out of the map meanwhile is fetched again: an insert into it would be acknowledged
        and logged, yet served by nothing."""
        while True:
            partition = get()
            with partition.lock:
                if not partition.retired:
                    yield partition
                    return

    def attach_journal(self, journal) -> None:
        with self._lock:
            self.journal = journal
            for partition in self._by_key.values():
                partition.journal = journal

    def take_namespace(self, namespace: str) -> int:
        """Take ``namespace``'s stores out of the map (a clear), emptied and retired; returns
        how many entries they held. The journal is not told of each removal (one "clear"
        record stands for them all)."""
        with self._lock:
            taken = [self._by_key.pop(key) for key in [k for k in self._by_key if k[0] == namespace]]
        removed = 0
        for partition in taken:
            with partition.lock:
                partition.retired = True
                removed += len(partition) + partition.cold()
                partition.drop_disk()
                partition.journal = None
                partition.entries.clear()
                for index in partition.indexes.values():
                    discard(index)
                partition.indexes.clear()
                partition.by_text.clear()
                partition.bytes = 0
        return removed

    def forget_namespace(self, namespace: str) -> None:
        """Drop ``namespace``'s stores from the map (replaying a logged clear)."""
        with self._lock:
            for key in [k for k in self._by_key if k[0] == namespace]:
                partition = self._by_key.pop(key)
                for index in partition.indexes.values():
                    discard(index)
                partition.drop_disk()

    def remove_where(self, matches: Callable[[CacheEntry], bool], namespace: str | None = None,
                     cold: bool = True, on_removed: Callable[[Key, CacheEntry], None] | None = None) -> int:
        """Remove the entries (of ``namespace``, or all) that ``matches``; returns how many.
        ``cold``: the disk tiers' entries too (every row read back). ``on_removed(key, entry)``:
        told of each memory entry removed, under the store's lock."""
        removed = 0
        for partition in self.all():
            if namespace is not None and partition.key[0] != namespace:
                continue
            with partition.lock:
                for entry_id in [e.entry_id for e in partition.entries.values() if matches(e)]:
                    entry = partition.remove(entry_id, with_vector=on_removed is not None)
                    removed += 1
                    if on_removed is not None and entry is not None:
                        on_removed(partition.key, entry)
                if cold and partition.disk is not None:
                    removed += partition.disk.remove_where(matches)
        return removed

    def drop_expired_cold(self, now: float) -> int:
        """The disk tiers' expired rows (by their expiry column, nothing read back)."""
        removed = 0
        for partition in self.all():
            with partition.lock:
                removed += partition.drop_expired_cold(now)
        return removed

    def retire_idle(self) -> int:
        """Take the stores that are empty and that no insert or removal touched since the
        last call out of the map; returns how many. Without this a namespace or experiment
        no one uses any more kept its stores, indexes and two metric series each for the life
        of the process (bench/soak.py: one more store per short-lived namespace). A request
        for the key later makes a new store."""
        with self._lock:
            candidates = list(self._by_key.items())
        retired = 0
        for key, partition in candidates:
            seen, self._idle_marks[key] = self._idle_marks.get(key), partition.mutations
            if len(partition) or partition.cold() or seen != partition.mutations:
                continue
            with partition.lock:
                if len(partition) or partition.cold() or partition.mutations != seen:
                    continue
                with self._lock:
                    if self._by_key.get(key) is partition:
                        del self._by_key[key]
                        partition.retired = True
                        retired += 1
        with self._lock:
            for key in [k for k in self._idle_marks if k not in self._by_key]:
                del self._idle_marks[key]
        return retired

    def _new(self, key: Key, spec: IndexSpec, capacity_entries: int, capacity_bytes: int) -> Partition:
        partition = Partition(key, self.dim, spec, capacity_entries, capacity_bytes, self.backends)
        partition.journal = self.journal
        return partition
