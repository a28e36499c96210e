"""Error-bounded thresholds: learn, from verdicts, the lowest similarity that keeps the share
of wrong hits under a user-set bound δ, per cached entry, per intent cluster, per arm.

Why. One cosine threshold for everything serves too little where paraphrases are far apart
and too much where different questions sit close together (issue 25). vCache (Schroeder et
al., 2025) learns a decision boundary per cached embedding from verdicts and bounds the error
rate. Our estimator keeps that idea (per-entry learning, a user δ, a conservative bound,
verdicts from exploration) but is simpler and threshold-shaped, so the warehouse, the
what-if and the dashboard read it like any other threshold:

* **What is estimated.** For a level (one entry, one intent cluster, or the whole arm) and a
  candidate threshold θ, the share of wrong verdicts among the verdicts at similarity ≥ θ
  estimates P(wrong | served) had that level served from θ. Its one-sided Clopper–Pearson
  upper bound at ``confidence`` must be ≤ δ.
* **Which θ.** Candidates on a grid (``step``) from 1.0 down to ``floor`` are tested in that
  fixed order, starting at the first with ``min_verdicts`` verdicts at or above it; the
  threshold is the last that passed before the first that fails (fixed-sequence testing: the
  chance that any passed threshold is wrong stays ≤ 1 − confidence, no multiplicity
  correction). Never below the lowest similarity judged (no extrapolation). A level that has enough verdicts but passes no candidate decides "serve
  nothing" (``NOTHING_SAFE``): the evidence says serving is unsafe there, so it does not
  fall back to a looser level.
* **Fallback.** A level with fewer than ``min_verdicts`` verdicts does not decide (it cannot
  certify δ even if all are correct): the entry falls back to its cluster, the cluster to the
  arm, the arm to its configured threshold ("static"). Verdicts are kept per level in bounded
  windows (the most recent ones), so the thresholds follow drift.
* **Exploration.** vCache explores by calling the model on a share of lookups it could have
  served and comparing answers. Here that exploration is the shadow check of near-misses
  (cache_core.shadow): a miss within ``near_miss_band`` below the threshold *used* already
  fetched the model's answer, so comparing it with the nearest cached answer is free, and
  nothing is ever served just to learn. The band follows the learnt threshold, so each level
  keeps sampling just below its own boundary and can move down as verdicts certify it.
* **Bias.** Verdicts above the threshold come from sampled hits (users, shadow hit checks);
  below it from near-misses. Wrong-answer odds fall with similarity, so as long as
  near-misses are checked at least as often as hits (the shadow defaults check every
  near-miss in the band and a share of hits), over-represented low-similarity verdicts make
  the estimate err on the safe side.

The state (``VerdictBook``) is a few bounded windows of ``(similarity, wrong)`` per arm; it
changes only through ``SemanticCache.apply`` of a ``Verdict`` (cache_core.state.changes), so
the write-ahead log, the snapshot and the entries topic carry it like any other change.
"""
from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

import numpy as np
from scipy.stats import beta

from cache_core.experiments import ErrorBoundedThresholds

ThresholdSource = Literal["entry", "cluster", "arm", "static"]
"""Which level decided a lookup's threshold (CacheEvent.threshold_source)."""
NOTHING_SAFE = 1.0 + 1e-6
"""The threshold of a level whose verdicts certify no candidate: no similarity reaches it."""

ENTRY_WINDOW = 128
CLUSTER_WINDOW = 1024
ARM_WINDOW = 8192
ENTRIES_REMEMBERED = 50_000
"""Per arm: entries whose verdicts are kept (least recently judged forgotten first)."""


@lru_cache(maxsize=65_536)
def wrong_upper_bound(wrong: int, n: int, confidence: float) -> float:
    """One-sided Clopper–Pearson upper bound on the wrong share, ``wrong`` of ``n`` verdicts."""
    if n <= 0 or wrong >= n:
        return 1.0
    return float(beta.ppf(confidence, wrong + 1, n - wrong))


def certified_threshold(similarities: np.ndarray, wrong: np.ndarray,
                        policy: ErrorBoundedThresholds) -> float | None:
    """The lowest grid threshold the verdicts certify (module docstring), ``NOTHING_SAFE`` if
    none, or None if fewer than ``policy.verdicts_needed`` verdicts: the level does not decide."""
    needed = policy.verdicts_needed
    if len(similarities) < needed:
        return None
    order = np.argsort(-similarities, kind="stable")
    sims, wrongs = similarities[order], np.cumsum(wrong[order])
    # Never below the lowest similarity judged: below it the verdicts say nothing new.
    grid = np.arange(1.0, max(policy.floor, float(sims[-1])) - 1e-9, -policy.step)
    # Verdicts at or above each candidate: sims is descending, so count via the ascending copy.
    counts = len(sims) - np.searchsorted(sims[::-1], grid - 1e-9, side="left")
    chosen = NOTHING_SAFE
    for theta, n in zip(grid, counts):
        if n < needed:
            continue  # not testable yet: too few verdicts this high
        if wrong_upper_bound(int(wrongs[n - 1]), int(n), policy.confidence) > policy.delta:
            break
        chosen = float(theta)
    return chosen


@dataclass
class _Window:
    """The most recent verdicts of one level and its threshold, computed when first needed."""

    size: int
    verdicts: deque = field(default_factory=deque)
    cached: tuple | None = None  # (policy, threshold)

    def add(self, similarity: float, wrong: bool) -> None:
        self.verdicts.append((similarity, wrong))
        while len(self.verdicts) > self.size:
            self.verdicts.popleft()
        self.cached = None

    def threshold(self, policy: ErrorBoundedThresholds) -> float | None:
        if self.cached is not None and self.cached[0] == policy:
            return self.cached[1]
        if len(self.verdicts) < policy.verdicts_needed:
            value = None
        else:
            data = np.array(self.verdicts, dtype=np.float64)
            value = certified_threshold(data[:, 0], data[:, 1] > 0.5, policy)
        self.cached = (policy, value)
        return value


class _ArmVerdicts:
    def __init__(self):
        self.arm = _Window(ARM_WINDOW)
        self.clusters: dict[int, _Window] = {}
        self.entries: OrderedDict[str, _Window] = OrderedDict()


@dataclass(frozen=True)
class Judged:
    """One verdict on a lookup's nearest (or served) entry at the similarity it was found at."""

    experiment_id: str
    arm: str
    entry_id: str
    cluster: int
    similarity: float
    wrong: bool


class VerdictBook:
    """Verdicts per (experiment, arm) at three levels, and the thresholds they certify.

    Thread-safe; ``threshold`` is on the lookup path (a dict lookup, or one recompute of a few
    thousand verdicts after a new verdict: well under a millisecond)."""

    def __init__(self):
        self._arms: dict[tuple[str, str], _ArmVerdicts] = {}
        self._lock = threading.Lock()

    def record(self, judged: Judged) -> None:
        with self._lock:
            arm = self._arms.setdefault((judged.experiment_id, judged.arm), _ArmVerdicts())
            entry = arm.entries.pop(judged.entry_id, None) or _Window(ENTRY_WINDOW)
            arm.entries[judged.entry_id] = entry  # most recently judged last
            while len(arm.entries) > ENTRIES_REMEMBERED:
                arm.entries.popitem(last=False)
            cluster = arm.clusters.setdefault(judged.cluster, _Window(CLUSTER_WINDOW))
            for window in (entry, cluster, arm.arm):
                window.add(float(judged.similarity), bool(judged.wrong))

    def threshold(self, experiment_id: str, arm: str, policy: ErrorBoundedThresholds, entry_id: str,
                  cluster: int, static: float) -> tuple[float, ThresholdSource]:
        """The threshold a candidate (entry ``entry_id`` of intent ``cluster``) must reach, and
        which level set it: the first of entry, cluster, arm that has enough verdicts, else
        ``static`` (the arm's configured threshold)."""
        with self._lock:
            verdicts = self._arms.get((experiment_id, arm))
            if verdicts is None:
                return static, "static"
            levels = ((verdicts.entries.get(entry_id), "entry"), (verdicts.clusters.get(cluster), "cluster"),
                      (verdicts.arm, "arm"))
            for window, source in levels:
                if window is not None:
                    value = window.threshold(policy)
                    if value is not None:
                        return value, source
        return static, "static"

    def counts(self, experiment_id: str, arm: str) -> dict[str, int]:
        """Verdicts held for an arm (all levels see each verdict once), for metrics and tests."""
        with self._lock:
            verdicts = self._arms.get((experiment_id, arm))
            if verdicts is None:
                return {"verdicts": 0, "entries": 0, "clusters": 0}
            return {"verdicts": len(verdicts.arm.verdicts), "entries": len(verdicts.entries),
                    "clusters": len(verdicts.clusters)}

    # -- persistence (cache_core.state.persistence snapshot) ------------------------------

    def export_state(self) -> dict:
        """Every window as JSON-ready lists (``load_state`` reads them back)."""
        def rows(window: _Window) -> list:
            return [[round(s, 6), int(w)] for s, w in window.verdicts]

        with self._lock:
            return {"arms": [{"experiment_id": exp, "arm": name, "arm_verdicts": rows(v.arm),
                              "clusters": {str(c): rows(w) for c, w in v.clusters.items()},
                              "entries": {e: rows(w) for e, w in v.entries.items()}}
                             for (exp, name), v in self._arms.items()]}

    def load_state(self, state: dict) -> None:
        """Replace the verdicts with ``export_state``'s; raises KeyError / ValueError / TypeError
        on another shape."""
        arms: dict[tuple[str, str], _ArmVerdicts] = {}
        for item in state["arms"]:
            verdicts = _ArmVerdicts()
            _fill(verdicts.arm, item["arm_verdicts"])
            for cluster, rows in item["clusters"].items():
                _fill(verdicts.clusters.setdefault(int(cluster), _Window(CLUSTER_WINDOW)), rows)
            for entry_id, rows in item["entries"].items():
                _fill(verdicts.entries.setdefault(str(entry_id), _Window(ENTRY_WINDOW)), rows)
            arms[(str(item["experiment_id"]), str(item["arm"]))] = verdicts
        with self._lock:
            self._arms = arms


def _fill(window: _Window, rows: list) -> None:
    for similarity, wrong in rows:
        window.add(float(similarity), bool(wrong))
