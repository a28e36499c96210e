"""The ``adaptive`` TTL policy (cache_core.lifetime has the others): each entry's lifetime
predicted from its context, learned online.

Model: online linear *quantile* regression of the log reuse gap. A reuse gap is the
time from an entry's last use (its store or its previous hit) to the next lookup that
wanted it: a hit on it, or a lookup that met it expired at or above the arm's threshold
(the gap it would have needed to live). With features x (a bias, request-rate
volatility, the hit-rate trend, memory pressure, log(1 + the entry's own hits)) the
policy predicts ``exp(w . x)`` seconds, clamped to the arm's ``[ttl_min_s, ttl_max_s]``,
and after each observed gap ``y`` takes one step of (normalised) stochastic gradient
descent on the pinball loss: ``w += lr * (q - [log y < w . x]) * x / |x|^2``. The prediction converges to the
q-quantile (default 0.9) of the reuse gaps in that context: an entry lives long enough
for nine in ten of the reuses that contexts like its own see, no longer.

Why this and not the seed's small LSTM: the label is one number per reuse, arriving one
at a time on the request path; a five-weight model learns from each in microseconds
under the partition lock, needs no training set, no framework and no warm-up schedule,
and each weight reads as "how much longer (e^w) per unit of this input", which is what
the lifetime attribution has to explain. The quantile loss, rather than squared error,
aims at covering most reuses instead of the mean gap (the mean would expire half the
entries just before their next hit). An LSTM would earn its keep on long sequential
patterns per entry; a cache entry has a handful of hits.

Censoring: a gap longer than an entry's lifetime is seen when a lookup meets the expired
entry, or, once the expiry sweep removed it, its ghost (``StoreLifetime.ghosts``); gaps
longer than the ghosts are remembered stay unseen, so the model may still err short;
``ttl_min_s`` is the floor that bounds this.
State is per store (arm partition), in memory: a restart starts from the prior.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from cache_core.experiments import ArmConfig
    from cache_core.store.partition import Partition
    from cache_core.records import CacheEntry, SearchOutcome

FEATURES = ("bias", "rate_volatility", "hit_trend", "memory_pressure", "entry_hits")
GAP_FLOOR_S = 0.1
"""Reuse gaps below this count as this (log of zero)."""


@dataclass(frozen=True)
class TtlContext:
    """The inputs of one prediction, logged in the event."""

    rate_volatility: float
    """Coefficient of variation of the store's request counts per bucket (recent minutes)."""
    hit_trend: float
    """Recent hit rate minus the longer-run hit rate (fast and slow moving averages)."""
    memory_pressure: float
    """The fuller of entries / capacity_entries and bytes / capacity_bytes, 0..1."""
    entry_hits: int
    """The entry's own hits so far (0 for a new entry)."""

    def vector(self) -> np.ndarray:
        return np.array([1.0, self.rate_volatility, self.hit_trend, self.memory_pressure,
                         math.log1p(self.entry_hits)])


class TrafficStats:
    """A store's recent request rate (counts per ``bucket_s`` over ``buckets`` buckets) and
    hit rate (a fast and a slow exponentially weighted mean). The clock is the caller's."""

    def __init__(self, bucket_s: float = 10.0, buckets: int = 12, fast: float = 0.1, slow: float = 0.01):
        self.bucket_s = bucket_s
        self._counts: deque[tuple[int, int]] = deque(maxlen=buckets)
        self.fast, self.slow = fast, slow
        self.hit_fast: float | None = None
        self.hit_slow: float | None = None

    def record(self, now: float, hit: bool) -> None:
        bucket = int(now // self.bucket_s)
        if self._counts and self._counts[-1][0] == bucket:
            self._counts[-1] = (bucket, self._counts[-1][1] + 1)
        else:
            self._counts.append((bucket, 1))
        value = 1.0 if hit else 0.0
        self.hit_fast = value if self.hit_fast is None else self.hit_fast + self.fast * (value - self.hit_fast)
        self.hit_slow = value if self.hit_slow is None else self.hit_slow + self.slow * (value - self.hit_slow)

    def volatility(self, now: float) -> float:
        """Coefficient of variation of the counts of the complete buckets in the window, empty
        buckets included (0 with fewer than two)."""
        current = int(now // self.bucket_s)
        first = current - self._counts.maxlen
        counts = dict((b, c) for b, c in self._counts if first <= b < current)
        if not counts:
            return 0.0
        start = min(counts)
        series = np.array([counts.get(b, 0) for b in range(start, current)], dtype=float)
        if len(series) < 2 or series.mean() == 0:
            return 0.0
        return float(series.std() / series.mean())

    def trend(self) -> float:
        if self.hit_fast is None or self.hit_slow is None:
            return 0.0
        return self.hit_fast - self.hit_slow


class AdaptiveTtl:
    """Online quantile regression of log reuse gaps (see the module docstring)."""

    def __init__(self, min_s: float, max_s: float, quantile: float = 0.9, learning_rate: float = 0.05,
                 prior_s: float | None = None):
        if not 0.0 <= min_s <= max_s:
            raise ValueError(f"need 0 <= ttl_min_s <= ttl_max_s, got {min_s} and {max_s}")
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        self.min_s, self.max_s = min_s, max_s
        self.quantile = quantile
        self.learning_rate = learning_rate
        # Before any reuse is seen: the geometric middle of the range (a floor of 1 s).
        prior = prior_s if prior_s is not None else math.sqrt(max(min_s, 1.0) * max(max_s, 1.0))
        self.weights = np.zeros(len(FEATURES))
        self.weights[0] = math.log(max(prior, GAP_FLOOR_S))
        self.observations = 0

    def clamp_to(self, min_s: float, max_s: float) -> None:
        """Follow an arm's changed range; what was learnt stays."""
        if not 0.0 <= min_s <= max_s:
            raise ValueError(f"need 0 <= ttl_min_s <= ttl_max_s, got {min_s} and {max_s}")
        self.min_s, self.max_s = min_s, max_s

    def predict(self, context: TtlContext) -> float:
        raw = math.exp(min(float(self.weights @ context.vector()), 50.0))
        return min(max(raw, self.min_s), self.max_s)

    def observe(self, context: TtlContext, gap_s: float) -> None:
        """One reuse ``gap_s`` seconds after a use whose prediction had ``context``."""
        x = context.vector()
        target = math.log(max(gap_s, GAP_FLOOR_S))
        below = 1.0 if target < float(self.weights @ x) else 0.0
        # Normalised by |x|^2: each step moves the log prediction by lr (q - below) whatever
        # the features' scale (log(1 + hits) grows; unnormalised steps overshoot).
        self.weights += self.learning_rate * (self.quantile - below) * x / float(x @ x)
        self.observations += 1


GHOSTS = 2048
"""Expired entries a store remembers (vector, last use, context) to see the reuse gaps that
outlived them (see ``StoreLifetime.ghosts``)."""


class StoreLifetime:
    """One store's traffic statistics and model, and the ghosts of its expired entries.

    Ghosts: without them a reuse gap longer than the entry's lifetime is seen only when a lookup
    meets the expired entry before the expiry sweep removes it, rare with a sweep every few
    seconds, so the model learnt ever shorter lifetimes (bench/ttl_replay.py: 19 s on average,
    a quarter of a fixed 300 s TTL's hits). An entry the sweep removes leaves a ghost; a later
    miss whose nearest ghost is at or above the threshold observes the gap since the ghost's
    last use (once per ghost), as a lookup meeting the expired entry would have."""

    def __init__(self, min_s: float, max_s: float):
        self.traffic = TrafficStats()
        self.model = AdaptiveTtl(min_s, max_s)
        self.ghosts: deque[tuple[np.ndarray, float, TtlContext | None, str | None]] = deque(maxlen=GHOSTS)

    def remember(self, entry: CacheEntry) -> None:
        context = entry.ttl_context if isinstance(entry.ttl_context, TtlContext) else None
        self.ghosts.append((np.asarray(entry.embedding, dtype=np.float32),
                            entry.last_hit_at or entry.created_at, context, entry.scope))

    def nearest_ghost(self, vec: np.ndarray, scope: str | None, threshold: float) -> int | None:
        """Index of the nearest ghost of ``scope`` at or above ``threshold`` (None: none)."""
        if not self.ghosts:
            return None
        sims = np.stack([g[0] for g in self.ghosts]) @ np.asarray(vec, dtype=np.float32)
        for i in np.argsort(-sims):
            if sims[i] < threshold:
                return None
            if self.ghosts[i][3] == scope:
                return int(i)
        return None

    def context(self, now: float, pressure: float, entry_hits: int) -> TtlContext:
        return TtlContext(rate_volatility=round(self.traffic.volatility(now), 6),
                          hit_trend=round(self.traffic.trend(), 6),
                          memory_pressure=round(min(max(pressure, 0.0), 1.0), 6), entry_hits=entry_hits)


def event_fields(predicted_s: float, context: TtlContext) -> dict:
    """The prediction and its inputs as ``CacheEvent`` fields."""
    return {"ttl_predicted_s": predicted_s, "ttl_rate_volatility": context.rate_volatility,
            "ttl_hit_trend": context.hit_trend, "ttl_memory_pressure": context.memory_pressure,
            "ttl_entry_hits": context.entry_hits}


class AdaptiveLifetimes:
    """The cache's side of the policy: one ``StoreLifetime`` per store of an adaptive arm.
    Every method runs under the store's partition lock."""

    def __init__(self):
        self._stores: dict[tuple[str, str, str], StoreLifetime] = {}

    def of(self, partition: Partition, arm: ArmConfig) -> StoreLifetime | None:
        """The store's state, if its arm is adaptive (following the arm's range)."""
        if arm.ttl_policy != "adaptive":
            return None
        life = self._stores.get(partition.key)
        if life is None:
            life = self._stores.setdefault(partition.key, StoreLifetime(arm.ttl_min_s, arm.ttl_max_s))
        life.model.clamp_to(arm.ttl_min_s, arm.ttl_max_s)
        return life

    @staticmethod
    def pressure(partition: Partition) -> float:
        return max(len(partition) / partition.capacity_entries, partition.bytes / partition.capacity_bytes)

    def after_lookup(self, partition: Partition, arm: ArmConfig, outcome: SearchOutcome,
                     threshold: float | None, served: CacheEntry | None, now: float,
                     vec: np.ndarray | None = None, scope: str | None = None) -> dict:
        """After a lookup's decision, before ``served`` is touched: learn from the reuse gaps it
        revealed (the hit, candidates met expired at or above the threshold, or on a miss the
        nearest ghost of an entry the sweep removed, given the query's ``vec``), give the served
        entry its renewed TTL. Returns the event fields (none on other arms)."""
        life = self.of(partition, arm)
        if life is None:
            return {}
        life.traffic.record(now, served is not None)
        pressure = self.pressure(partition)
        wanted = [c.entry for c in outcome.expired if threshold is not None and c.similarity >= threshold]
        if served is not None:
            wanted.append(served)
        for entry in wanted:
            context = entry.ttl_context if isinstance(entry.ttl_context, TtlContext) else \
                life.context(now, pressure, entry.hit_count)
            life.model.observe(context, now - (entry.last_hit_at or entry.created_at))
        if served is None and not wanted and threshold is not None and vec is not None:
            ghost = life.nearest_ghost(vec, scope, threshold)
            if ghost is not None:  # a reuse that outlived its entry
                _vec, last_use, ghost_context, _scope = life.ghosts[ghost]
                del life.ghosts[ghost]
                life.model.observe(ghost_context or life.context(now, pressure, 0), now - last_use)
        context = life.context(now, pressure, served.hit_count + 1 if served is not None else 0)
        predicted = life.model.predict(context)
        if served is not None and served.ttl_policy == "adaptive":
            served.ttl_s, served.ttl_context = predicted, context
        return event_fields(predicted, context)

    def expired(self, key: tuple[str, str, str], entry: CacheEntry) -> None:
        """The expiry sweep removed ``entry`` of store ``key``: remember its ghost (adaptive arms)."""
        life = self._stores.get(key)
        if life is not None and entry.ttl_policy == "adaptive":
            life.remember(entry)

    def on_store(self, partition: Partition, arm: ArmConfig, entry: CacheEntry, explicit_ttl: bool,
                 now: float) -> None:
        """A new entry of an adaptive arm gets its predicted TTL (unless the store named one)."""
        life = self.of(partition, arm)
        if life is None or explicit_ttl:
            return
        context = life.context(now, self.pressure(partition), 0)
        entry.ttl_s, entry.ttl_context = life.model.predict(context), context
