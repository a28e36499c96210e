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
* **The audit** (``audit``; by default on below δ = 0.05; cache_core.decision.error_evidence). The curves
  choose where each level cuts; evidence decides how far to trust them. Every cut rises by one
  margin per arm, the lowest m >= 0 at which the verdicts at or above cut + m have a one-sided
  Clopper–Pearson bound (``confidence``, Kish effective count) at most δ: none certifies, nothing
  is served. Each verdict is measured against the cut its cluster had *before* it arrived (out of
  sample: measured against cuts fitted on the same verdicts, the clusters whose few verdicts were
  right by luck get the low cuts and then vouch for them), and counts for m only if every lookup at
  cut + m was checkable then (at or above its threshold minus the near-miss band). A level whose
  own verdicts show δ broken is raised (a monotone curve cannot, for wrong answers at the top);
  an entry goes below its cluster only as far as its own verdicts certify. ``audit: false``:
  the curves' cuts alone.

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
Over 500 lines because this docstring is the policy's specification; the code proper is the book
(``VerdictBook``, its windows and audit) and the two estimators' cut rules, which share that state.
"""
from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

import numpy as np
from scipy.stats import norm

from cache_core.decision import error_curves, error_evidence
from cache_core.decision.error_curves import ARM_PRIOR, CLUSTER_SPREAD, ENTRY_SPREAD
from cache_core.decision.error_evidence import wrong_upper_bound
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
    evidence: tuple | None = None  # curves estimator: ((key, policy), cut its own verdicts certify)
    unsafe: tuple | None = None  # curves estimator: ((key, policy), cuts from which they show δ broken)
    cut: tuple | None = None  # curves estimator, clusters: (policy, its last cut before the margin)

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
        self.margin: tuple | None = None
        """Curves estimator: ((generation, policy), the audit's margin) (``_margin``)."""
        self.audit: deque = deque(maxlen=ARM_WINDOW)
        """Curves estimator: (margin, wrong, check_prob, edge, depth) per verdict, out of sample (``_audited``)."""
        self.audit_policy: ErrorBoundedThresholds | None = None
        """The policy whose cuts the audit's margins were measured against (None: loaded, any)."""
        self.cut: tuple | None = None
        """Curves estimator: (policy, the arm's last cut), for verdicts of clusters without one."""
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
    audit: tuple[float, ...] | None = None
    """The audit's reading of this verdict as the replica that made the lookup measured it:
    (margin over its cluster's cut, edge, depth) (``_audited``), () for none (no cut yet), None for
    not measured yet (this replica measures it; a message from a replica before this field). Every
    replica applies the same reading, so their audits agree, whatever cuts each had in force."""

    def __post_init__(self):
        _check_prob(self.check_prob)
        if self.audit is not None and len(self.audit) not in (0, 3):
            raise ValueError(f"an audit reading is (margin, edge, depth) or (), got {self.audit!r}")


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

    def record(self, judged: Judged) -> tuple[float, ...]:
        """Learn ``judged``; returns the audit's reading of it (``Judged.audit``) for the other replicas."""
        with self._lock:
            arm = self._arms.setdefault((judged.experiment_id, judged.arm), _ArmVerdicts())
            entry = arm.entries.pop(judged.entry_id, None) or _Window(ENTRY_WINDOW)
            arm.entries[judged.entry_id] = entry  # most recently judged last
            while len(arm.entries) > ENTRIES_REMEMBERED:
                arm.entries.popitem(last=False)
            reading = _audited(arm, arm.clusters.get(judged.cluster), judged)
            cluster = arm.clusters.setdefault(judged.cluster, _Window(CLUSTER_WINDOW))
            for window in (entry, cluster, arm.arm):
                window.add(float(judged.similarity), bool(judged.wrong), float(judged.check_prob))
            return reading

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
                              "entries": {e: rows(w) for e, w in v.entries.items()},
                              "audit": [[round(m, 6), int(w), p, round(e, 6), round(d, 6)]
                                        for m, w, p, e, d in v.audit]}
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
            for margin, wrong, check_prob, edge, depth in item.get("audit", []):  # saved before the audit: none
                verdicts.audit.append((float(margin), float(bool(wrong)), _check_prob(check_prob), float(edge),
                                       float(depth)))
            arms[(str(item["experiment_id"]), str(item["arm"]))] = verdicts
        with self._lock:
            self._arms = arms


def _curves_threshold(verdicts: _ArmVerdicts, policy: ErrorBoundedThresholds, entry_id: str, cluster: int,
                      static: float) -> tuple[float, ThresholdSource]:
    """The ``curves`` estimator (cache_core.decision.error_curves): the arm decides once it holds
    ``policy.verdicts_needed`` verdicts and its audit (``_margin``) can test them; then a candidate's
    threshold is its level's cut (``_level_cut``) raised by the arm's margin. Curves and cuts are
    cached per level and refitted when the level or its parent changed; the arm's curve and margin
    after every ``REFIT_SHARE`` of its window in new verdicts (one Newton fit and one audit, each over
    up to ``ARM_WINDOW`` verdicts)."""
    arm = verdicts.arm
    if len(arm.verdicts) < policy.verdicts_needed:
        return static, "static"
    if verdicts.fitted_at < 0 or arm.added - verdicts.fitted_at >= max(1, int(REFIT_SHARE * len(arm.verdicts))):
        _refit_arm(verdicts)
    cut, source = _level_cut(verdicts, policy, cluster, entry_id)
    if not policy.audited:
        return cut, source
    margin = _margin(verdicts, policy)
    if margin is None:  # what the cuts would serve has too few verdicts behind it to certify δ
        return NOTHING_SAFE, source
    return min(cut + margin, NOTHING_SAFE), source


def _level_cut(verdicts: _ArmVerdicts, policy: ErrorBoundedThresholds, cluster: int,
               entry_id: str | None) -> tuple[float, ThresholdSource]:
    """A candidate's cut before the arm's margin, and which level set it: its cluster's curve's cut
    (the arm's if the cluster has no verdicts), raised past where the cluster's own verdicts show δ
    broken (``_raised``); then its entry's, raised the same way but lowered only as far as the entry's
    own verdicts certify (``_lowered``)."""
    z = _quantile(policy.confidence)
    arm = verdicts.arm
    arm_level = (arm, *arm.curve, None, "arm")
    arm_cut = _curve_cut(verdicts, *arm_level[:4], None, policy, z)
    cluster_window = verdicts.clusters.get(cluster)
    verdicts.cut = (policy, arm_cut)
    if cluster_window is None:
        return arm_cut, "arm"
    population = cluster_window if len(cluster_window.verdicts) >= POPULATION_MIN else None
    cluster_level = _child(cluster_window, arm_level, CLUSTER_SPREAD, "cluster")
    value = _curve_cut(verdicts, *cluster_level[:4], population, policy, z)
    if policy.audited:
        value = _raised(cluster_window, policy, value)
    cluster_window.cut = (policy, value)  # the audit measures the next verdicts against it
    entry_window = verdicts.entries.get(entry_id) if entry_id is not None else None
    if entry_window is None:
        return value, "cluster"
    entry_level = _child(entry_window, cluster_level, ENTRY_SPREAD, "entry")
    cut = _curve_cut(verdicts, *entry_level[:4], population, policy, z)
    if not policy.audited:  # the curves alone: the entry's own curve's cut
        return cut, "entry"
    cut = _raised(entry_window, policy, cut)
    lowered = _lowered(value, cut, _evidence_cut(entry_window, policy))
    return lowered, ("cluster" if lowered == value else "entry")


def _lowered(parent: float, cut: float, evidence: float | None) -> float:
    """An entry's cut given its cluster's: never below its own curve's ``cut`` (stricter needs no
    certificate), below its cluster's only as far as its *own* verdicts certify δ (``evidence``;
    None: too few). Its shrunk curve alone would lower it on a verdict or two the audit cannot see."""
    own = NOTHING_SAFE if evidence is None else evidence
    return max(cut, min(parent, own))


def _margin(verdicts: _ArmVerdicts, policy: ErrorBoundedThresholds) -> float | None:
    """The arm's audit: how far every cut must rise for the lookups served to keep δ, with
    ``policy.confidence``, on verdicts the cuts had not seen (module docstring). Each verdict's
    ``margin`` is its similarity minus the cut its cluster had when it arrived (``_audited``), and
    error_evidence.audited_margin finds the lowest m >= 0 whose verdicts (margin >= m, from times
    when all of them were checkable) certify δ; ``NOTHING_SAFE`` if none, None if too few effective
    verdicts to test any. Cached per arm refit."""
    key = (verdicts.generation, policy)
    if verdicts.margin is not None and verdicts.margin[0] == key:
        return verdicts.margin[1]
    value = None
    if verdicts.audit and verdicts.audit_policy in (None, policy):
        data = np.array(verdicts.audit, dtype=np.float64)
        band = max(0.0, float(data[:, 4].max()))  # the near-miss band: the deepest a check fell below
        value = error_evidence.audited_margin(data[:, 0], data[:, 1], 1.0 / data[:, 2], data[:, 3], band,
                                              policy.delta, policy.confidence, policy.verdicts_needed,
                                              policy.step, 1.0 - policy.floor, NOTHING_SAFE)
    verdicts.margin = (key, value)
    return value


def _audited(verdicts: _ArmVerdicts, window: _Window | None, judged: Judged) -> tuple[float, ...]:
    """Keep ``judged`` for the audit, measured against the cut its cluster (the arm's, for a cluster
    without one yet) was last given: computed before this verdict arrived, so the audit is out of
    sample. Judged against cuts fitted on the same verdicts, the clusters whose few verdicts happened
    to be right get the low cuts and then vouch for them (bench.error_bound at δ = 0.02: 2.5-2.7%
    wrong where δ was 2%). Its edge is the margin in force then, the same for every cluster, so a
    margin counts only times when every cluster's lookups there were checkable (while serving nothing,
    the band below 1.0 reaches the lowest cut last): a per-verdict edge let clusters with nothing
    checkable drop out of the audit while still being served (bursts of 16% wrong at δ = 0.05).
    Not before any cut (the arm has not decided yet). A verdict another replica measured
    (``judged.audit`` set) is kept as it read it: each replica's own cuts differ a little (the
    verdicts arrive in another order), and audits of the same verdicts must agree. Returns the reading
    kept: (margin, edge, depth), or () for none."""
    last = window.cut if window is not None and window.cut is not None else verdicts.cut
    if last is not None:
        if verdicts.audit_policy not in (None, last[0]):  # another δ or confidence: another audit
            verdicts.audit.clear()
        verdicts.audit_policy = last[0]
    reading = judged.audit if judged.audit is not None else _reading(verdicts, last, float(judged.similarity))
    if reading:
        margin, edge, depth = reading
        verdicts.audit.append((float(margin), float(judged.wrong), float(judged.check_prob), float(edge), float(depth)))
    return tuple(reading)


def _reading(verdicts: _ArmVerdicts, last: tuple | None, similarity: float) -> tuple[float, ...]:
    """This replica's audit reading of a verdict at ``similarity``, against the cut ``last`` (policy, cut)."""
    if last is None or last[1] >= NOTHING_SAFE:
        return ()
    policy, cut = last
    margin = verdicts.margin[1] if verdicts.margin is not None and verdicts.margin[0][1] == policy else None
    serving = margin is not None and margin < NOTHING_SAFE
    depth = (min(cut + margin, NOTHING_SAFE) if serving else NOTHING_SAFE) - similarity
    # Serving nothing, checks come only from the band below 1.0, which reaches the lowest cut last.
    edge = margin if serving else NOTHING_SAFE - _lowest_cut(verdicts, policy)
    return (similarity - cut, edge, depth)


def _lowest_cut(verdicts: _ArmVerdicts, policy: ErrorBoundedThresholds) -> float:
    """The lowest cut any cluster (or the arm) was last given under ``policy``."""
    cuts = [w.cut[1] for w in verdicts.clusters.values() if w.cut is not None and w.cut[0] == policy]
    if verdicts.cut is not None and verdicts.cut[0] == policy:
        cuts.append(verdicts.cut[1])
    return min(cuts, default=NOTHING_SAFE)


def _refit_arm(verdicts: _ArmVerdicts) -> None:
    """Refit the arm's curve (warm-started) and snapshot the population its cuts average over."""
    arm = verdicts.arm
    sims, wrong, weights = arm.arrays()
    last = None if arm.curve is None else arm.curve[1].mean
    arm.curve = ((verdicts.generation + 1,),
                 error_curves.fit(sims, wrong, (ARM_PRIOR.mean, ARM_PRIOR.cov), last, weights))
    verdicts.generation, verdicts.fitted_at = verdicts.generation + 1, arm.added
    verdicts.population = (sims, weights)


def _curve_cut(verdicts: _ArmVerdicts, window: _Window, key: tuple, curve, parent, population: _Window | None,
               policy: ErrorBoundedThresholds, z: float) -> float:
    """The lowest cut at which the mean of a level's curve bound over ``population``'s verdicts (the
    cluster's; None: the arm's) is at most δ (error_curves.served_error_threshold), cached."""
    arm_key = verdicts.arm.curve[0]
    bound_key = (key, (population.added,) if population is not None else arm_key, policy)
    if window.bound is None or window.bound[0] != bound_key:
        if population is not None:
            sims, _, weights = population.arrays()
        else:
            sims, weights = verdicts.population
        value = error_curves.served_error_threshold(
            lambda s: error_curves.upper(curve, s, z, parent), sims, policy.delta, policy.floor,
            policy.step, NOTHING_SAFE, weights)
        window.bound = (bound_key, value)
    return window.bound[1]


def _evidence_cut(window: _Window, policy: ErrorBoundedThresholds) -> float | None:
    """The lowest cut a level's own verdicts certify (error_evidence.evidence_threshold), cached."""
    key = window.added
    if window.evidence is None or window.evidence[0] != (key, policy):
        sims, wrong, weights = window.arrays()
        lowest = max(policy.floor, float(sims.min())) if len(sims) else policy.floor  # no extrapolation
        value = error_evidence.evidence_threshold(sims, wrong, weights, policy.delta, policy.confidence,
                                                  policy.verdicts_needed, lowest, policy.step, NOTHING_SAFE)
        window.evidence = ((key, policy), value)
    return window.evidence[1]


def _raised(window: _Window, policy: ErrorBoundedThresholds, cut: float) -> float:
    """``cut``, raised past the cuts from which the level's own verdicts show δ broken
    (error_evidence.unsafe_cuts, cached per window)."""
    if window.unsafe is None or window.unsafe[0] != (window.added, policy):
        sims, wrong, weights = window.arrays()
        window.unsafe = ((window.added, policy),
                         error_evidence.unsafe_cuts(sims, wrong, weights, policy.delta, policy.confidence, policy.step))
    return error_evidence.raised_past_unsafe(cut, window.unsafe[1], policy.step, NOTHING_SAFE)


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
