"""Threshold recommendations and canary verdicts, free of any UI or I/O.

``recommend`` picks, for one arm (or one intent cluster of it), the threshold with
the highest estimated hit rate whose false-hit rate stays under the operator's
target with confidence: the one-sided (1 - alpha) Clopper-Pearson upper bound of
the false-hit rate among feedback-labelled hits at or above the threshold must be
<= target. Guardrails: enough traffic and labels, at most ``max_step`` per change,
and a cool-down since the arm's last change (from ``threshold_changes``).

Labels exist only for served hits, so the false-hit rate below the lowest labelled
similarity is unknown: such thresholds are never recommended. Moving in steps, and
trying a step on a canary first, earns the labels for the next step.

Multi-similarity arms: a decision counts as a hit at t only if the arm's current
mixed-score floor and answer margin also pass its logged ``score`` / ``score_margin``
(``multi_blocks`` of queries.similarity_histogram; the labelled hits are filtered the
same way). Those were logged for the best-ranked candidate past the cosine threshold
*in force at decision time*, so the replay holds at or above that threshold (above it,
approximately: a raised gate may drop a rival or the winner, which the log cannot
show, and a miss's ``similarity`` is its nearest candidate's cosine, not necessarily
the best-ranked one's); below it candidates were never ranked at all. Thresholds under the lowest
logged one (``multi_min_threshold``) are therefore unsupported and never recommended.
``margin_table`` replays other answer margins at the logged cosine gates.

``evaluate_canary`` says promote / rollback / continue for a running canary from its
labelled hits, with the sequential test (safe to re-evaluate on every run) or a
fixed one-sided bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from cache_core.experiments import CanaryConfig, ExperimentConfig
from dashboard.stats import DEFAULT_ALPHA, ProportionStat, lower_bound, rate_vs_target, upper_bound

BIN_WIDTH = 0.001
"""Similarity bin of queries.similarity_histogram / labelled_similarity (similarity_milli)."""

Action = Literal["change", "hold"]
CanaryAction = Literal["promote", "rollback", "continue"]


@dataclass(frozen=True)
class Guardrails:
    """What a recommendation must respect."""

    target_false_hit_rate: float = 0.05
    alpha: float = DEFAULT_ALPHA
    min_decisions: int = 200
    """Logged decisions needed before recommending anything."""
    min_labelled: int = 30
    """Feedback-labelled hits at or above a candidate threshold for its bound to count."""
    max_step: float = 0.03
    """Largest change of a threshold in one push."""
    cooldown_s: float = 1800.0
    """Time since the arm's last change before the next one."""
    grid_step: float = 0.005

    def __post_init__(self) -> None:
        if not 0.0 < self.target_false_hit_rate < 1.0:
            raise ValueError(f"target false-hit rate must be in (0, 1), got {self.target_false_hit_rate}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.max_step <= 0 or self.grid_step <= 0:
            raise ValueError("max_step and grid_step must be positive")
        if self.min_decisions < 0 or self.min_labelled < 0 or self.cooldown_s < 0:
            raise ValueError("minimum sizes and cool-down must not be negative")


@dataclass(frozen=True)
class Recommendation:
    arm: str
    cluster: int | None
    """None: the arm's own threshold; else that intent cluster's threshold."""
    current: float
    recommended: float | None
    action: Action
    reason: str
    current_hit_rate: float | None = None
    recommended_hit_rate: float | None = None
    false_hit_upper: float | None = None
    """Upper confidence bound of the false-hit rate at the recommended threshold."""
    labelled: int = 0
    candidates: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False, compare=False)


@dataclass(frozen=True)
class CanaryDecision:
    action: CanaryAction
    reason: str
    labelled: int
    wrong: int
    false_hit_rate: float | None
    evidence: float | None
    """The always-valid p-value (sequential) or the bound that decided (fixed)."""


def _bins(df: pd.DataFrame, value_cols: list[str], key: str = "similarity_milli") -> pd.DataFrame:
    """Sum ``value_cols`` per ``key`` bin (NA bins dropped), sorted by bin."""
    if df.empty:
        return pd.DataFrame({key: pd.Series([], dtype="int64"),
                             **{c: pd.Series([], dtype="int64") for c in value_cols}})
    known = df[df[key].notna()]
    out = known.groupby(key, as_index=False)[value_cols].sum()
    out[key] = out[key].astype("int64")
    return out.sort_values(key)


def _at_or_above(bins: pd.DataFrame, col: str, thresholds: np.ndarray, key: str = "similarity_milli") -> np.ndarray:
    """For each threshold: sum of ``col`` over bins whose every value is >= the threshold."""
    edges = bins[key].to_numpy()
    suffix = np.concatenate([np.cumsum(bins[col].to_numpy()[::-1])[::-1], [0]])
    first_bin = np.ceil(thresholds / BIN_WIDTH - 1e-9).astype("int64")
    return suffix[np.searchsorted(edges, first_bin, side="left")]


def replay_floor(similarity_hist: pd.DataFrame) -> float | None:
    """The lowest cosine threshold the multi-rule rows of ``similarity_hist`` (one arm,
    or one cluster of it) were logged at; None when there are none (cosine arm)."""
    if similarity_hist.empty or "multi_min_threshold" not in similarity_hist:
        return None
    low = pd.to_numeric(similarity_hist["multi_min_threshold"], errors="coerce").min()
    return None if pd.isna(low) else float(low)


def drop_unreplayable(curve: pd.DataFrame, similarity_hist: pd.DataFrame) -> pd.DataFrame:
    """``curve`` rows (arm, threshold, ...) except multi arms' thresholds under their
    ``replay_floor`` in ``similarity_hist`` (what the logs cannot tell)."""
    if curve.empty or similarity_hist.empty:
        return curve
    floors = {arm: replay_floor(rows) for arm, rows in similarity_hist.groupby("arm")}
    low = curve["arm"].map(lambda arm: floors.get(arm)).astype("float64")
    return curve[~(curve["threshold"] < low - 1e-9)]


def servable(hist: pd.DataFrame) -> pd.Series:
    """Per row of queries.similarity_histogram: decisions a threshold at or under the bin
    could serve (not guard-blocked, and for multi arms not refused by the current floor /
    margin). The threshold what-if of the control panel counts the same."""
    blocked = hist["guard_blocks"] if "guard_blocks" in hist else 0
    if "multi_blocks" in hist:
        blocked = blocked + hist["multi_blocks"]
    return hist["decisions"] - blocked


def threshold_table(similarity_hist: pd.DataFrame, labelled: pd.DataFrame, thresholds,
                    alpha: float = DEFAULT_ALPHA) -> pd.DataFrame:
    """Per candidate threshold: estimated hit rate and the false-hit rate with its upper bound.

    ``similarity_hist`` rows (decisions, hits, guard_blocks and, for multi arms,
    multi_blocks / multi_min_threshold per bin) and ``labelled`` rows (correct, wrong per
    bin) should already be narrowed to one arm (and cluster). ``supported``: labels reach
    down to the threshold and (multi arms, ``replayable``) it is not under the lowest
    logged cosine threshold.
    """
    thresholds = np.asarray(list(thresholds), dtype="float64")
    hist = similarity_hist
    decisions = int(hist["decisions"].sum()) if not hist.empty else 0
    sims = _bins(hist.assign(servable=servable(hist)) if not hist.empty else hist, ["servable"])
    labels = _bins(labelled, ["correct", "wrong"])
    est_hits = _at_or_above(sims, "servable", thresholds)
    wrong = _at_or_above(labels, "wrong", thresholds)
    n_labelled = wrong + _at_or_above(labels, "correct", thresholds)
    lowest_label = labels["similarity_milli"].min() * BIN_WIDTH if not labels.empty else math.inf
    floor = replay_floor(hist)
    rows = []
    for t, hits, n, w in zip(thresholds, est_hits, n_labelled, wrong):
        stat = ProportionStat(int(n), int(w))
        replayable = floor is None or t >= floor - 1e-9
        rows.append({"threshold": round(float(t), 6), "decisions": decisions, "est_hits": int(hits),
                     "est_hit_rate": hits / decisions if decisions else None,
                     "labelled": int(n), "wrong": int(w), "false_hit_rate": stat.rate,
                     "false_hit_upper": upper_bound(stat, alpha), "replayable": replayable,
                     "supported": bool(t >= lowest_label - 1e-9) and replayable})
    return pd.DataFrame(rows)


def margin_grid(current: float) -> list[float]:
    """A few answer margins around ``current`` for the multi what-if, current included."""
    grid = [0.0, current / 2, current, current * 2, current + 0.01, current + 0.02, current + 0.05]
    return sorted({round(min(max(m, 0.0), 1.0), 4) for m in grid})


def margin_table(margin_hist: pd.DataFrame, decisions: int, margins, alpha: float = DEFAULT_ALPHA) -> pd.DataFrame:
    """Per candidate answer margin of one multi arm: estimated hits and the false-hit rate.

    ``margin_hist`` is queries.multi_margin_histogram narrowed to the arm (decisions whose
    score reaches the floor, no guard blocking, per margin bin; NA = no rival answer, served
    at any margin); ``decisions`` is all of the arm's logged decisions (the denominator).
    The cosine gate stays as logged, where the replay is exact (guards aside). Only served
    hits carry labels: a margin that would serve decisions (with a rival) in bins under the
    lowest labelled one is ``supported=False``, its false-hit rate ignores them.
    """
    margins = np.asarray(list(margins), dtype="float64")
    hist = margin_hist
    no_rival = hist[hist["margin_milli"].isna()] if not hist.empty else hist
    base = {c: int(no_rival[c].sum()) if not no_rival.empty else 0 for c in ("decisions", "correct", "wrong")}
    bins = _bins(hist, ["decisions", "correct", "wrong"], key="margin_milli")
    with_rival = _at_or_above(bins, "decisions", margins, key="margin_milli")
    est = base["decisions"] + with_rival
    wrong = base["wrong"] + _at_or_above(bins, "wrong", margins, key="margin_milli")
    n = wrong + base["correct"] + _at_or_above(bins, "correct", margins, key="margin_milli")
    labelled_bins = bins[(bins["correct"] + bins["wrong"]) > 0]
    # Served decisions with a rival in bins under the lowest labelled one: unlabelled.
    if labelled_bins.empty:
        unlabelled = with_rival
    else:
        lowest = np.array([labelled_bins["margin_milli"].min() * BIN_WIDTH])
        unlabelled = with_rival - _at_or_above(bins, "decisions", lowest, key="margin_milli")[0]
    rows = []
    for m, hits, k, w, u in zip(margins, est, n, wrong, unlabelled):
        stat = ProportionStat(int(k), int(w))
        rows.append({"answer_margin": round(float(m), 6), "decisions": int(decisions), "est_hits": int(hits),
                     "est_hit_rate": hits / decisions if decisions else None, "labelled": int(k), "wrong": int(w),
                     "false_hit_rate": stat.rate, "false_hit_upper": upper_bound(stat, alpha),
                     "supported": bool(u <= 0)})
    return pd.DataFrame(rows)


def candidate_grid(current: float, guardrails: Guardrails) -> np.ndarray:
    """Thresholds within ``max_step`` of ``current`` on the grid, current included, inside [0, 1]."""
    steps = int(math.floor(guardrails.max_step / guardrails.grid_step + 1e-9))
    grid = current + guardrails.grid_step * np.arange(-steps, steps + 1)
    return np.unique(np.round(np.clip(grid, 0.0, 1.0), 6))


def recommend(arm: str, current: float, similarity_hist: pd.DataFrame, labelled: pd.DataFrame,
              guardrails: Guardrails, *, now_ms: int, last_change_ms: int | None = None,
              cluster: int | None = None) -> Recommendation:
    """The guarded best threshold for one arm (or cluster); see the module docstring."""
    g = guardrails
    table = threshold_table(similarity_hist, labelled, candidate_grid(current, g), g.alpha)
    now_row = table.loc[(table["threshold"] - current).abs().idxmin()]
    base = dict(arm=arm, cluster=cluster, current=current, current_hit_rate=now_row["est_hit_rate"],
                candidates=table)
    decisions = int(table["decisions"].iloc[0]) if not table.empty else 0
    if decisions < g.min_decisions:
        return Recommendation(**base, recommended=None, action="hold",
                              reason=f"only {decisions} logged decisions, need {g.min_decisions}")
    if last_change_ms is not None and now_ms - last_change_ms < g.cooldown_s * 1000:
        waited = (now_ms - last_change_ms) / 1000
        return Recommendation(**base, recommended=None, action="hold",
                              reason=f"cool-down: last change {waited:.0f}s ago, need {g.cooldown_s:.0f}s")
    table["feasible"] = (table["supported"] & (table["labelled"] >= g.min_labelled)
                         & (table["false_hit_upper"] <= g.target_false_hit_rate))
    feasible = table[table["feasible"]]
    if feasible.empty:
        return _no_feasible(base, table, now_row, g)
    best = feasible.sort_values(["est_hit_rate", "threshold"], ascending=[False, False]).iloc[0]
    return _recommendation(base, best, current, "best hit rate with the false-hit bound under target")


def _recommendation(base: dict, row: pd.Series, current: float, why: str) -> Recommendation:
    recommended = float(row["threshold"])
    moved = abs(recommended - current) > 1e-9
    return Recommendation(
        **base, recommended=recommended, action="change" if moved else "hold",
        reason=why if moved else "the current threshold is already the best within the guardrails",
        recommended_hit_rate=row["est_hit_rate"], false_hit_upper=row["false_hit_upper"],
        labelled=int(row["labelled"]))


def _no_feasible(base: dict, table: pd.DataFrame, now_row: pd.Series, g: Guardrails) -> Recommendation:
    unsafe_now = (now_row["labelled"] >= g.min_labelled
                  and now_row["false_hit_upper"] is not None
                  and now_row["false_hit_upper"] > g.target_false_hit_rate)
    if unsafe_now:  # over target at the current threshold: step up as far as allowed
        return _recommendation(base, table.iloc[-1], base["current"],
                               f"false-hit bound {now_row['false_hit_upper']:.1%} above target "
                               f"{g.target_false_hit_rate:.1%} and no candidate is safe: raising by the max step")
    return Recommendation(**base, recommended=None, action="hold",
                          reason=f"no candidate has {g.min_labelled}+ labelled hits with the "
                                 f"false-hit bound under {g.target_false_hit_rate:.1%}")


def _narrow(df: pd.DataFrame, arm: str, cluster: int | None) -> pd.DataFrame:
    out = df[df["arm"] == arm] if not df.empty else df
    if cluster is not None and not out.empty:
        out = out[out["intent_cluster"] == cluster]
    return out


def recommend_all(config: ExperimentConfig, similarity_hist: pd.DataFrame, labelled: pd.DataFrame,
                  guardrails: Guardrails, *, now_ms: int, last_change_ms: dict[str, int] | None = None,
                  clusters: bool = False) -> list[Recommendation]:
    """One recommendation per arm (and, with ``clusters``, per intent cluster seen in the data).

    Arms with a running canary are skipped: the canary is evaluated first.
    """
    last = last_change_ms or {}
    out = []
    for arm in config.arms:
        if arm.canary is not None:
            continue
        targets: list[int | None] = [None]
        if clusters and not similarity_hist.empty:
            seen = similarity_hist.loc[similarity_hist["arm"] == arm.name, "intent_cluster"]
            targets += sorted(int(c) for c in seen.unique() if c >= 0)
        for cluster in targets:
            out.append(recommend(arm.name, arm.threshold_for(cluster), _narrow(similarity_hist, arm.name, cluster),
                                 _narrow(labelled, arm.name, cluster), guardrails, now_ms=now_ms,
                                 last_change_ms=last.get(arm.name), cluster=cluster))
    return out


def evaluate_canary(canary: CanaryConfig, labelled: ProportionStat, *, min_labelled: int = 30,
                    alpha: float = DEFAULT_ALPHA,
                    method: Literal["sequential", "bound"] = "sequential") -> CanaryDecision:
    """Promote, roll back, or keep watching a canary, from its labelled hits (n, wrong).

    rollback: the false-hit rate is above ``canary.target_false_hit_rate`` with confidence;
    promote: it is below with confidence and at least ``min_labelled`` labels are in;
    continue: otherwise. ``sequential`` uses the always-valid mSPRT (the auto-tune loop
    re-evaluates on every run); ``bound`` uses fixed one-sided Clopper-Pearson bounds.
    """
    target = canary.target_false_hit_rate
    n, wrong, rate = labelled.n, labelled.successes, labelled.rate
    if method == "sequential":
        side, evidence = rate_vs_target(labelled, target, alpha)
        above, below = side == "above", side == "below"
    elif method == "bound":
        low, high = lower_bound(labelled, alpha), upper_bound(labelled, alpha)
        above = low is not None and low > target
        below = high is not None and high < target
        evidence = low if above else high
    else:
        raise ValueError(f"unknown method {method!r}; choose 'sequential' or 'bound'")
    shown = "—" if rate is None else f"{rate:.1%}"
    if above:
        return CanaryDecision("rollback", f"false-hit rate {shown} ({wrong}/{n}) is above the target "
                              f"{target:.1%} with confidence", n, wrong, rate, evidence)
    if below and n >= min_labelled:
        return CanaryDecision("promote", f"false-hit rate {shown} ({wrong}/{n}) is below the target "
                              f"{target:.1%} with confidence", n, wrong, rate, evidence)
    need = f"; {n}/{min_labelled} labels" if n < min_labelled else ""
    return CanaryDecision("continue", f"not yet conclusive: {shown} ({wrong}/{n}) vs target {target:.1%}{need}",
                          n, wrong, rate, evidence)
