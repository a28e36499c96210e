"""How long an entry lives, and how expired entries leave.

Policies (an arm's ``ttl_policy``). ``absolute``: alive until created_at + ttl.
``sliding``: every hit renews the ttl, but never past created_at + max_age_s.
``adaptive``: like sliding, with each entry's ttl predicted at its store and again at each
hit from its context by a model learnt online (``cache_core.adaptive_ttl``). A
near-duplicate admission (cache_core.admission) adds a grace period to either. The ttl is
the store request's if it gives one, else the arm's when its config sets ``ttl_s``, else
the service's default (``ttl_for``). ``CacheEntry.expires_at`` applies the policy.

Expiry is lazy first: an expired entry goes when a lookup finds it among its candidates
or a store's eviction scan meets it at the LRU end. A store nobody asks any more (a namespace
a tenant stopped using, a retired document set, a conversation that ended) would therefore keep
its expired entries for the life of the process, in memory and in every snapshot; the soak
(bench/soak.py) measured that as entries growing without bound with short-lived namespaces.
``ExpirySweeper`` removes them every ``interval_s`` (``SemanticCache.drop_expired``: one
partition lock at a time, removals logged like any other expiry), takes the stores that
stayed empty and untouched for a whole interval out of the cache
(``SemanticCache.retire_idle_stores``), then gives the C heap's
free pages back to the OS (``cache_core.heap.trim``: without it the encoder's freed batch
buffers kept the RSS climbing; ``trim_heap=False`` leaves the heap alone).
"""
from __future__ import annotations

import logging
import threading
import time

from typing import TYPE_CHECKING

from cache_core import heap

if TYPE_CHECKING:
    from cache_core.experiments import ArmConfig

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 60.0


def ttl_for(arm: ArmConfig, ttl_s: float | None, default_ttl_s: float | None) -> float:
    """A new entry's ttl: the request's, else the arm's if its config sets one, else the default."""
    if ttl_s is None:
        explicit = "ttl_s" in arm.model_fields_set
        ttl_s = arm.ttl_s if explicit or default_ttl_s is None else default_ttl_s
    return float(ttl_s)


class ExpirySweeper:
    """Calls ``cache.drop_expired()`` every ``interval_s`` in a daemon thread."""

    def __init__(self, cache, interval_s: float = DEFAULT_INTERVAL_S, name: str = "scache-expiry",
                 trim_heap: bool = True):
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.cache = cache
        self.interval_s = interval_s
        self.trim_heap = trim_heap
        self.trims = 0
        self.sweeps = 0
        self.removed = 0
        self.stores_retired = 0
        self.errors = 0
        self.last_sweep_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "ExpirySweeper":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def sweep(self) -> int:
        """One pass over every partition; returns how many expired entries it removed."""
        started = time.perf_counter()
        removed = self.cache.drop_expired()
        retired = self.cache.retire_idle_stores()
        self.last_sweep_s = time.perf_counter() - started
        self.sweeps += 1
        self.removed += removed
        self.stores_retired += retired
        if removed or retired:
            log.info("expired entries swept", extra={"removed": removed, "stores_retired": retired,
                                                      "seconds": round(self.last_sweep_s, 4)})
        return removed

    def stats(self) -> dict:
        return {"sweeps": self.sweeps, "removed": self.removed,
                "stores_retired": self.stores_retired, "errors": self.errors, "heap_trims": self.trims,
                "last_sweep_s": self.last_sweep_s, "alive": self._thread.is_alive()}

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sweep()
                if self.trim_heap:
                    self.trims += heap.trim()
            except Exception:  # a failed pass must not end the sweeping
                self.errors += 1
                log.exception("expiry sweep failed")
