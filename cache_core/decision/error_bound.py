"""Error-bounded thresholds: learn, from verdicts, the lowest similarity that keeps the share
of wrong hits under a user-set bound δ, per cached entry, per intent cluster, per arm.

Why. One cosine threshold for everything serves too little where paraphrases are far apart
and too much where different questions sit close together (issue 25). vCache (Schroeder et
al., 2025) learns a decision boundary per cached embedding from verdicts and bounds the error
rate. We keep that idea (per-entry learning, a user δ, a conservative bound, verdicts from
exploration) in our own, threshold-shaped estimators, so the warehouse, the what-if and the
dashboard read the result like any other threshold. Two estimators (``estimator``):

**curves** (the default; the fitting is cache_core.decision.error_curves). vCache fits, per
entry, a logistic P(correct | similarity) from that entry's own observations and serves where
a confidence bound on it reaches 1 − δ. We fit the same kind of curve per level, P(wrong | s),
but shrink each entry's toward its cluster's and each cluster's toward the arm's (the parent's
curve is the child's prior), so an entry with no or few verdicts has its cluster's curve rather
than none: every lookup is decided by its entry's or cluster's own curve once the arm holds
``verdicts_needed`` verdicts (before: the arm's static threshold).

* **Which θ.** δ bounds the share of wrong *hits*, an average over what is served, not the odds
  at the threshold. A level's threshold is the lowest θ (grid from 1.0 down to ``floor``) at
  which the mean of the curve's upper bound (``confidence``) over the similarities its lookups
  were judged at, at or above θ, is ≤ δ. Those similarities are its cluster's verdicts (the
  arm's while the cluster has fewer than ``POPULATION_MIN``). A smooth, monotone curve cannot
  be blocked by one wrong verdict at the top of the range, as the staircase was.
* **Nothing safe.** A level whose bound passes no θ serves nothing (``NOTHING_SAFE``).

**staircase** (the first design, kept as the bench's reference).

* **What is estimated.** For a level (one entry, one intent cluster, or the whole arm) and a
  candidate threshold θ, the share of wrong verdicts among the verdicts at similarity ≥ θ
  estimates P(wrong | served) had that level served from θ. Its one-sided Clopper–Pearson
  upper bound at ``confidence`` must be ≤ δ.
* **Which θ.** Candidates on a grid (``step``) from 1.0 down to ``floor`` are tested in that
  fixed order, starting at the first with ``min_verdicts`` verdicts at or above it; the
  threshold is the last that passed before the first that fails (fixed-sequence testing: the
  chance that any passed threshold is wrong stays ≤ 1 − confidence, no multiplicity
  correction). Never below the lowest similarity judged (no extrapolation). A level that has
  enough verdicts but passes no candidate decides "serve nothing" (``NOTHING_SAFE``). One
  wrong verdict among the first few at the top fails the first test and blocks every θ below.
* **Fallback.** A level with fewer than ``min_verdicts`` verdicts does not decide (it cannot
  certify δ even if all are correct): the entry falls back to its cluster, the cluster to the
  arm, the arm to its configured threshold ("static").

Both:

* **Windows.** Verdicts are kept per level in bounded windows (the most recent ones), so the
  thresholds follow drift.
* **Exploration.** vCache explores by calling the model on a share of lookups it could have
  served (with a probability that shrinks as the bound tightens) and comparing answers. Here
  that exploration is the shadow check of near-misses (cache_core.shadow): a miss within
  ``near_miss_band`` below the threshold *used* already fetched the model's answer, so
  comparing it with the nearest cached answer is free, and nothing is ever served just to
  learn. The band follows the learnt threshold, so each level keeps sampling just below its own
  boundary and can move down as verdicts show it safe; sampled hits check above it.
* **Bias.** Verdicts above the threshold come from sampled hits (users, shadow hit checks);
  below it from near-misses, and the two are checked at different rates (the shadow defaults
  check every near-miss in the band and a share of hits). Each ``Judged`` carries the probability
  its lookup was checked, and the curves weigh each verdict by its inverse (``check_prob``): the
  fits and the averaging population are then those of the lookups, not of the checked sample.
  Unweighted, the logistic curve (a simplification of the real odds) was fitted where the checks
  crowd (at the cold start, near-misses in [0.90, 1.0) at rate 1; later, each band just below the
  threshold) and extrapolated too flat: on bench.error_bound's mixed stream at δ = 0.05 it
  overshot (up to 6.1% wrong, the excess from hits below 0.85 served 40% wrong); weighted it kept
  δ on every seed. The weights are scaled to the effective sample size, so unequal weights widen
  the curve's uncertainty rather than multiply the evidence. The staircase ignores them.

The state (``VerdictBook``) is a few bounded windows of ``(similarity, wrong, check_prob)`` per arm; it
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
from scipy.stats import beta, norm

from cache_core.decision import error_curves
from cache_core.decision.error_curves import ARM_PRIOR, CLUSTER_SPREAD, ENTRY_SPREAD
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
REFIT_SHARE = 0.02
"""Curves estimator: the arm's curve is refitted after this share of its window in new verdicts."""
POPULATION_MIN = 20
"""Curves estimator: a cluster's thresholds average over its own verdicts' similarities once it has
this many, over the arm's before."""


@lru_cache(maxsize=65_536)
def wrong_upper_bound(wrong: int, n: int, confidence: float) -> float:
    """One-sided Clopper–Pearson upper bound on the wrong share, ``wrong`` of ``n`` verdicts."""
    if n <= 0 or wrong >= n:
        return 1.0
    return float(beta.ppf(confidence, wrong + 1, n - wrong))


@lru_cache(maxsize=64)
def _quantile(confidence: float) -> float:
    return float(norm.ppf(confidence))


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
    added: int = 0
    """Verdicts ever added (keys the curves fitted from this window)."""
    curve: tuple | None = None  # curves estimator: (key, Curve)
    bound: tuple | None = None  # curves estimator: (key, policy, threshold)

    def add(self, similarity: float, wrong: bool, check_prob: float = 1.0) -> None:
        self.verdicts.append((similarity, wrong, check_prob))
        while len(self.verdicts) > self.size:
            self.verdicts.popleft()
        self.cached = None
        self.added += 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Similarities, wrong flags and weights (inverse check probabilities)."""
        data = np.array(self.verdicts, dtype=np.float64).reshape(-1, 3)
        return data[:, 0], data[:, 1] > 0.5, 1.0 / data[:, 2]

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
        self.generation = 0
        """Curves estimator: how many times the arm's curve was refitted (keys its children's)."""
        self.fitted_at = -1
        """``arm.added`` when the arm's curve was last fitted."""
        self.population = (np.zeros(0), np.zeros(0))
        """The arm's verdict similarities and weights at that fit (the lookups its thresholds average over)."""


@dataclass(frozen=True)
class Judged:
    """One verdict on a lookup's nearest (or served) entry at the similarity it was found at."""

    experiment_id: str
    arm: str
    entry_id: str
    cluster: int
    similarity: float
    wrong: bool
    check_prob: float = 1.0
    """The probability this lookup was checked at all (a shadow check's sampling rate of hits or of
    near-misses, a solicited user verdict's ``feedback_prob``; 1.0 when unknown). Each verdict
    weighs 1 / check_prob in the curves and the averages, so hits checked at a quarter of the rate
    of near-misses count for the four times as many lookups they stand for."""

    def __post_init__(self):
        _check_prob(self.check_prob)


def _check_prob(value: float) -> float:
    """``value`` as a check probability; ValueError outside (0, 1] (a corrupt state or message)."""
    if not 0.0 < float(value) <= 1.0:
        raise ValueError(f"check_prob must be in (0, 1], got {value}")
    return float(value)


class VerdictBook:
    """Verdicts per (experiment, arm) at three levels, and the thresholds they certify.

    Thread-safe; ``threshold`` is on the lookup path: a few dict lookups when nothing changed
    (~10 µs), a refit of the level's curve and threshold after a new verdict on it (~0.5 ms), and
    every ``REFIT_SHARE`` of the arm's window one refit of the arm's curve over up to
    ``ARM_WINDOW`` verdicts, warm-started from the last (a few ms; measured on a loaded 2-core
    machine)."""

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
                window.add(float(judged.similarity), bool(judged.wrong), float(judged.check_prob))

    def threshold(self, experiment_id: str, arm: str, policy: ErrorBoundedThresholds, entry_id: str,
                  cluster: int, static: float) -> tuple[float, ThresholdSource]:
        """The threshold a candidate (entry ``entry_id`` of intent ``cluster``) must reach, and
        which level set it: the first of entry, cluster, arm that has enough verdicts, else
        ``static`` (the arm's configured threshold)."""
        with self._lock:
            verdicts = self._arms.get((experiment_id, arm))
            if verdicts is None:
                return static, "static"
            if policy.estimator == "curves":
                return _curves_threshold(verdicts, policy, entry_id, cluster, static)
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
            return [[round(s, 6), int(w), p] for s, w, p in window.verdicts]

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


def _curves_threshold(verdicts: _ArmVerdicts, policy: ErrorBoundedThresholds, entry_id: str, cluster: int,
                      static: float) -> tuple[float, ThresholdSource]:
    """The ``curves`` estimator (cache_core.decision.error_curves): the arm decides once it holds
    ``policy.verdicts_needed`` verdicts; then every candidate gets the threshold of the most specific
    level that has verdicts of its own (an entry's, else its cluster's, else the arm's curve: a level
    without verdicts has its parent's curve, so its threshold too). Curves and thresholds are cached
    per level and refitted when the level or its parent changed; the arm's curve is refitted after
    every ``REFIT_SHARE`` of its window in new verdicts (one Newton fit over up to ``ARM_WINDOW``)."""
    arm = verdicts.arm
    if len(arm.verdicts) < policy.verdicts_needed:
        return static, "static"
    if verdicts.fitted_at < 0 or arm.added - verdicts.fitted_at >= max(1, int(REFIT_SHARE * len(arm.verdicts))):
        sims, wrong, weights = arm.arrays()
        last = None if arm.curve is None else arm.curve[1].mean
        arm.curve = ((verdicts.generation + 1,),
                     error_curves.fit(sims, wrong, (ARM_PRIOR.mean, ARM_PRIOR.cov), last, weights))
        verdicts.generation, verdicts.fitted_at = verdicts.generation + 1, arm.added
        verdicts.population = (sims, weights)
    z = _quantile(policy.confidence)
    arm_key, arm_curve = arm.curve
    levels = [(arm, arm_key, arm_curve, None, "arm")]
    cluster_window = verdicts.clusters.get(cluster)
    if cluster_window is not None:
        levels.append(_child(cluster_window, levels[-1], CLUSTER_SPREAD, "cluster"))
        entry_window = verdicts.entries.get(entry_id)
        if entry_window is not None:
            levels.append(_child(entry_window, levels[-1], ENTRY_SPREAD, "entry"))
    window, key, curve, parent, source = levels[-1]
    own_population = cluster_window is not None and len(cluster_window.verdicts) >= POPULATION_MIN
    bound_key = (key, (cluster_window.added,) if own_population else arm_key, policy)
    if window.bound is None or window.bound[0] != bound_key:
        if own_population:
            population, _, weights = cluster_window.arrays()
        else:
            population, weights = verdicts.population
        value = error_curves.served_error_threshold(
            lambda s: error_curves.upper(curve, s, z, parent), population, policy.delta, policy.floor,
            policy.step, NOTHING_SAFE, weights)
        window.bound = (bound_key, value)
    return window.bound[1], source


def _child(window: _Window, parent_level: tuple, spread: np.ndarray, source: ThresholdSource) -> tuple:
    """A level's (window, key, curve, parent curve, source), its curve shrunk toward its parent's."""
    _, parent_key, parent_curve, _, _ = parent_level
    key = parent_key + (window.added,)
    if window.curve is None or window.curve[0] != key:
        sims, wrong, weights = window.arrays()
        last = None if window.curve is None else window.curve[1].mean
        window.curve = (key, error_curves.fit(sims, wrong, parent_curve.as_prior(spread), last, weights))
    return window, key, window.curve[1], parent_curve, source


def _fill(window: _Window, rows: list) -> None:
    for row in rows:  # [similarity, wrong, check_prob]; states saved before check_prob have two columns
        similarity, wrong, check_prob = (*row, 1.0) if len(row) == 2 else row
        window.add(float(similarity), bool(wrong), _check_prob(check_prob))
