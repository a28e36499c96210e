"""Threshold recommendations and canary verdicts, free of any UI or I/O.

``recommend`` picks, for one arm (or one intent cluster of it), the threshold with
the highest estimated hit rate whose false-hit rate stays under the operator's
target with confidence: the one-sided (1 - alpha) Clopper-Pearson upper bound of
the false-hit rate among feedback-labelled hits at or above the threshold must be
<= target. Guardrails: enough traffic and labels, at most ``max_step`` per change,
and a cool-down since the arm's last change (from ``threshold_changes``).

Labels exist only for served hits, so the false-hit rate below the lowest labelled
similarity is unknown: such thresholds are never recommended. Moving in steps, and
trying a step on a canary first, earns the labels for the next step. ``exploration``
takes that step when nothing else will: an arm already at its best supported threshold
with the bound under target, and no labels below it, gets a canary one max step down
(``action="explore"``). Its labelled hits then promote or roll it back, so auto-tune
loosens as well as tightens. A rolled-back canary leaves labels that stop the same step
while they are in the lookback window, and the audit remembers it for longer
(``Guardrails.explore_memory_s``, ``rolled_back_canaries``): until then explorations of
that arm stay above the value it tried.

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
``recommend_multi`` tunes a multi arm's score floor and answer margin together with the
objective and guardrails of ``recommend``, from queries.multi_score_histogram (cosine gate
as logged): the floor / margin in force decided only whether the best-ranked candidate was
served, so a pair at or above the lowest ones the window was logged at (known per config
version from the audit) replays: what it serves passed the logged pair, so its guard verdict
and label are in the log (exact when the window ran one pair). Pairs under them are never
recommended.

``evaluate_canary`` says promote / rollback / continue for a running canary from its
labelled hits, with the sequential test (safe to re-evaluate on every run) or a
fixed one-sided bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Literal

import numpy as np
import pandas as pd

from cache_core.decision.thresholds import multi_for, threshold_for
from cache_core.experiments import CanaryConfig, ExperimentConfig
from dashboard.control.stats import DEFAULT_ALPHA, ProportionStat, lower_bound, rate_vs_target, upper_bound

BIN_WIDTH = 0.001
"""Similarity bin of queries.similarity_histogram / labelled_similarity (similarity_milli)."""

Action = Literal["change", "hold", "explore"]
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
    explore_memory_s: float = 7 * 86400.0
    """How long a rolled-back canary keeps explorations at or below the value it tried."""

    def __post_init__(self) -> None:
        if not 0.0 < self.target_false_hit_rate < 1.0:
            raise ValueError(f"target false-hit rate must be in (0, 1), got {self.target_false_hit_rate}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.max_step <= 0 or self.grid_step <= 0:
            raise ValueError("max_step and grid_step must be positive")
        if min(self.min_decisions, self.min_labelled, self.cooldown_s, self.explore_memory_s) < 0:
            raise ValueError("minimum sizes, cool-down and explore memory must not be negative")


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


def candidate_grid(current: float, guardrails: Guardrails, low: float = 0.0, high: float = 1.0) -> np.ndarray:
    """Values within ``max_step`` of ``current`` on the grid, current included, inside [low, high]."""
    steps = int(math.floor(guardrails.max_step / guardrails.grid_step + 1e-9))
    grid = current + guardrails.grid_step * np.arange(-steps, steps + 1)
    return np.unique(np.round(np.clip(grid, low, high), 6))


def _not_yet(decisions: int, last_change_ms: int | None, now_ms: int, g: Guardrails) -> str | None:
    """Why no change may be recommended yet (too few decisions, cool-down), or None."""
    if decisions < g.min_decisions:
        return f"only {decisions} logged decisions, need {g.min_decisions}"
    if last_change_ms is not None and now_ms - last_change_ms < g.cooldown_s * 1000:
        waited = (now_ms - last_change_ms) / 1000
        return f"cool-down: last change {waited:.0f}s ago, need {g.cooldown_s:.0f}s"
    return None


def _over_target(now_row: pd.Series, g: Guardrails) -> bool:
    """Enough labels at the current setting, and its false-hit bound is above the target."""
    return bool(now_row["labelled"] >= g.min_labelled and now_row["false_hit_upper"] is not None
                and now_row["false_hit_upper"] > g.target_false_hit_rate)


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
    wait = _not_yet(decisions, last_change_ms, now_ms, g)
    if wait is not None:
        return Recommendation(**base, recommended=None, action="hold", reason=wait)
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


def _step_down(table: pd.DataFrame, column: str, current: float, known: str,
               failed_at: float | None = None) -> pd.Series | None:
    """The lowest candidate row under ``current`` (in ``column``) whose ``known`` flag is off and
    that stays above ``failed_at`` (a value a rolled-back canary tried), if the logs say it would
    serve more than the row at ``current`` (else lowering changes nothing)."""
    below = table[(table[column] < current - 1e-9) & ~table[known].astype(bool)]
    if failed_at is not None:
        below = below[below[column] > failed_at + 1e-9]
    if below.empty:
        return None
    step = below.loc[below[column].idxmin()]
    now = table.loc[(table[column] - current).abs().idxmin()]
    return step if step["est_hits"] > now["est_hits"] else None


def _explore_step(table: pd.DataFrame, column: Literal["threshold", "score_floor"], current: float, known: str,
                  failed: RolledBack | None) -> tuple[pd.Series | None, str]:
    """``_step_down`` kept above the ``column`` value ``failed`` tried (if it tried one), and
    what to add to the reason: that the step is smaller, or, when the failure alone left no
    step, that it blocks exploring lower ("" when it made no difference)."""
    failed_at = getattr(failed, column) if failed is not None else None
    step = _step_down(table, column, current, known, failed_at)
    if failed_at is None:
        return step, ""
    if step is not None:
        return step, f"; a smaller step: {failed.describe(column)}"
    blocked = _step_down(table, column, current, known) is not None
    return None, f"; not exploring lower: {failed.describe(column)}" if blocked else ""


def exploration(rec: Recommendation, failed: RolledBack | None = None) -> Recommendation | None:
    """A canary-only step down for an arm (not a cluster) that ``recommend`` holds at its
    current threshold because that is the best supported one: the lowest candidate under it
    that the labels do not reach, when some decisions sit between the two (else lowering
    changes nothing). None when there is nothing to explore. Only ever try it on a canary:
    it is, by construction, a threshold whose false-hit rate is unknown.

    ``failed`` (``last_failed_try``): a canary of this arm that tried a threshold and was
    rolled back. The step then stays above that threshold (a smaller step), and when no
    candidate is left the hold says why, so the arm does not retry a refuted value as soon
    as the refuting labels leave the lookback window."""
    if rec.cluster is not None or rec.recommended is None or abs(rec.recommended - rec.current) > 1e-9:
        return None
    step, note = _explore_step(rec.candidates, "threshold", rec.current, "supported", failed)
    if step is None:
        return replace(rec, reason=rec.reason + note) if note else None
    return replace(rec, recommended=float(step["threshold"]), action="explore",
                   recommended_hit_rate=step["est_hit_rate"],
                   reason=f"exploring {step['threshold']:.3f} on a canary: {rec.current:.3f} is the best supported "
                          f"threshold (false-hit bound {rec.false_hit_upper:.1%} at {rec.labelled} labels) and no "
                          f"labels reach below it{note}")


def _no_feasible(base: dict, table: pd.DataFrame, now_row: pd.Series, g: Guardrails) -> Recommendation:
    if _over_target(now_row, g):  # over target at the current threshold: step up as far as allowed
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
            out.append(recommend(arm.name, threshold_for(arm, cluster), _narrow(similarity_hist, arm.name, cluster),
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


# -- multi arms: score floor and answer margin ------------------------------------------

@dataclass(frozen=True)
class MultiRecommendation:
    """A multi arm's guarded best (score floor, answer margin) pair; see ``recommend_multi``."""

    arm: str
    current_floor: float
    current_margin: float
    recommended_floor: float | None
    recommended_margin: float | None
    action: Action
    reason: str
    current_hit_rate: float | None = None
    recommended_hit_rate: float | None = None
    false_hit_rate: float | None = None
    """Observed false-hit rate of the labelled hits the recommended pair would serve."""
    false_hit_upper: float | None = None
    labelled: int = 0
    decisions: int = 0
    lowest_floor: float | None = None
    """The lowest floor (and margin) in force when the window's events were logged: the
    replay holds at or above them only."""
    lowest_margin: float | None = None
    candidates: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False, compare=False)


def configs_by_version(history: pd.DataFrame, *configs: ExperimentConfig | None) -> dict[int, ExperimentConfig]:
    """Every config whose version is known: the ``config_json`` of queries.change_history
    rows plus ``configs`` (the experiments file's, the live one); later arguments win."""
    known: dict[int, ExperimentConfig] = {}
    if not history.empty:
        for config_json in history["config_json"]:
            if config_json:
                config = ExperimentConfig.model_validate_json(config_json)
                known[config.version] = config
    for config in configs:
        if config is not None:
            known[config.version] = config
    return known


@dataclass(frozen=True)
class RolledBack:
    """A canary the audit shows ending without its values becoming the arm's."""

    arm: str
    at_ms: int
    """When it ended (the audit row's time)."""
    threshold: float | None
    """The cosine threshold it tried; None when it kept the arm's."""
    score_floor: float | None
    """A multi canary's score floor; None when it kept the arm's."""

    def describe(self, what: Literal["threshold", "score_floor"]) -> str:
        when = datetime.fromtimestamp(self.at_ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        return f"a canary at {what.replace('_', ' ')} {getattr(self, what):.3f} was rolled back at {when}"


def rolled_back_canaries(history: pd.DataFrame, configs: dict[int, ExperimentConfig]) -> list[RolledBack]:
    """Every canary in queries.change_history that ended with the arm's threshold and multi
    settings unchanged (auto-tune's or an operator's rollback, or a restore), newest first;
    ``configs`` from ``configs_by_version``. A promotion changes the arm, so it is not one."""
    if history.empty:
        return []
    found: list[RolledBack] = []
    rows = history.drop_duplicates("new_version").sort_values("new_version", ascending=False)
    for row in rows.itertuples(index=False):
        before, after = configs.get(int(row.old_version)), configs.get(int(row.new_version))
        if before is None or after is None:
            continue
        kept = {arm.name: arm for arm in after.arms}
        for arm in before.arms:
            now = kept.get(arm.name)
            if arm.canary is None or now is None or now.canary is not None:
                continue
            if now.threshold != arm.threshold or now.multi != arm.multi:
                continue
            tried = arm.canary
            found.append(RolledBack(arm.name, int(pd.Timestamp(row.ts).timestamp() * 1000),
                                    tried.threshold if abs(tried.threshold - arm.threshold) > 1e-9 else None,
                                    tried.score_floor))
    return found


def last_failed_try(rolled_back: list[RolledBack], arm: str, what: Literal["threshold", "score_floor"],
                    now_ms: int, g: Guardrails) -> RolledBack | None:
    """The rolled-back canary of ``arm`` within ``g.explore_memory_s`` that tried the highest
    ``what`` (the one that bounds an exploration), if any."""
    since = now_ms - g.explore_memory_s * 1000
    tries = [r for r in rolled_back if r.arm == arm and r.at_ms >= since and getattr(r, what) is not None]
    return max(tries, key=lambda r: getattr(r, what), default=None)


def logged_rules(configs: dict[int, ExperimentConfig], arm: str) -> dict[int, tuple[float, float]]:
    """config version -> (score floor, answer margin) of ``arm`` where it was a multi arm.
    With a canary that tried another floor / margin, the higher of the two each: only at
    or above both did every unit serve what the pair serves (so its labels are there)."""
    out = {}
    for version, config in configs.items():
        if arm in [a.name for a in config.arms] and config.arm(arm).similarity == "multi":
            arm_config = config.arm(arm)
            base, canary = arm_config.multi, multi_for(arm_config, "canary")
            out[version] = (float(max(base.threshold, canary.threshold)),
                            float(max(base.answer_margin, canary.answer_margin)))
    return out


def multi_replay_limits(score_hist: pd.DataFrame,
                        rules: dict[int, tuple[float, float]]) -> tuple[float | None, float | None, list[int]]:
    """(lowest floor, lowest margin, unknown versions) over the config versions that logged
    mixed scores in ``score_hist`` (queries.multi_score_histogram narrowed to one arm).
    A version missing from ``rules`` is listed: nobody can tell which floor it ran."""
    if score_hist.empty:
        return None, None, []
    versions = sorted(int(v) for v in score_hist.loc[score_hist["score_milli"].notna(), "config_version"].unique())
    unknown = [v for v in versions if v not in rules]
    known = [rules[v] for v in versions if v in rules]
    if not known:
        return None, None, unknown
    return min(f for f, _ in known), min(m for _, m in known), unknown


def multi_table(score_hist: pd.DataFrame, floors, margins, *, lowest_floor: float | None,
                lowest_margin: float | None, alpha: float = DEFAULT_ALPHA) -> pd.DataFrame:
    """Per candidate (score_floor, answer_margin) of one multi arm: estimated hits and the
    false-hit rate with its upper bound, from ``score_hist`` (queries.multi_score_histogram:
    per config version x score bin x margin bin, decisions / servable / correct / wrong).

    A decision is served at (f, m) iff it is ``servable`` (logged in multi mode, something
    past the cosine gate, no guard veto), its score bin reaches f and its margin bin is NA
    (no rival answer) or reaches m; the cosine gate stays as logged. The denominator is all
    of the arm's logged decisions. ``replayable``: f and m are not under the lowest floor /
    margin in force when the events were logged. Up there every decision the pair serves
    was served then (so its label, if any, is in the data) and the replay is exact.
    """
    floors = np.asarray(list(floors), dtype="float64")
    margins = np.asarray(list(margins), dtype="float64")
    pairs = np.array([(f, m) for f in floors for m in margins], dtype="float64").reshape(-1, 2)
    hist = score_hist
    decisions = int(hist["decisions"].sum()) if not hist.empty else 0
    if hist.empty:
        served = wrong = labelled = np.zeros(len(pairs), dtype="int64")
    else:
        # NA score: never served; NA margin: no rival, passes any margin.
        score = pd.to_numeric(hist["score_milli"], errors="coerce").astype("float64").fillna(-np.inf).to_numpy()
        margin = pd.to_numeric(hist["margin_milli"], errors="coerce").astype("float64").fillna(np.inf).to_numpy()
        first_score = np.ceil(pairs[:, 0] / BIN_WIDTH - 1e-9)
        first_margin = np.ceil(pairs[:, 1] / BIN_WIDTH - 1e-9)
        values = hist[["servable", "correct", "wrong"]].to_numpy("int64")
        # One pass per pair (a few hundred at most) keeps memory at one mask of the rows.
        sums = np.array([values[(score >= fs) & (margin >= fm)].sum(axis=0)
                         for fs, fm in zip(first_score, first_margin)], dtype="int64").reshape(-1, 3)
        served, wrong = sums[:, 0], sums[:, 2]
        labelled = sums[:, 1] + wrong
    rows = []
    for (f, m), hits, n, w in zip(pairs, served, labelled, wrong):
        stat = ProportionStat(int(n), int(w))
        replayable = (lowest_floor is not None and lowest_margin is not None
                      and f >= lowest_floor - 1e-9 and m >= lowest_margin - 1e-9)
        rows.append({"score_floor": round(float(f), 6), "answer_margin": round(float(m), 6),
                     "decisions": decisions, "est_hits": int(hits),
                     "est_hit_rate": hits / decisions if decisions else None, "labelled": int(n), "wrong": int(w),
                     "false_hit_rate": stat.rate, "false_hit_upper": upper_bound(stat, alpha),
                     "replayable": bool(replayable)})
    columns = ["score_floor", "answer_margin", "decisions", "est_hits", "est_hit_rate", "labelled", "wrong",
               "false_hit_rate", "false_hit_upper", "replayable"]
    return pd.DataFrame(rows, columns=columns)


def recommend_multi(arm: str, score_floor: float, answer_margin: float, score_hist: pd.DataFrame,
                    rules: dict[int, tuple[float, float]], guardrails: Guardrails, *, now_ms: int,
                    last_change_ms: int | None = None) -> MultiRecommendation:
    """The guarded best score floor and answer margin of one multi arm.

    The objective and guard rails of ``recommend``: the pair with the highest estimated hit
    rate whose one-sided Clopper-Pearson upper bound of the false-hit rate (labelled hits
    the pair would serve) is <= the target with ``min_labelled`` labels; each of floor and
    margin moves at most ``max_step`` (on ``grid_step``), ``min_decisions`` and the cool-down
    apply. Only ``replayable`` pairs (``multi_table``) are candidates: never under the lowest
    floor / margin the window's events were logged at (``rules``: config version -> (floor,
    margin)); a window with events of an unknown config version holds. Ties (same estimated
    hits) go to the pair closest to the current one, then the higher floor and margin. Over target at the current pair with nothing safe: the floor
    rises by the max step (margin kept), as ``recommend`` raises a threshold.
    """
    g = guardrails
    low_floor, low_margin, unknown = multi_replay_limits(score_hist, rules)
    table = multi_table(score_hist, candidate_grid(score_floor, g, -1.0, 1.0), candidate_grid(answer_margin, g),
                        lowest_floor=low_floor, lowest_margin=low_margin, alpha=g.alpha)
    at_now = (table["score_floor"] - score_floor).abs() + (table["answer_margin"] - answer_margin).abs()
    now_row = table.loc[at_now.idxmin()]
    decisions = int(now_row["decisions"])
    base = dict(arm=arm, current_floor=score_floor, current_margin=answer_margin,
                current_hit_rate=now_row["est_hit_rate"], decisions=decisions, lowest_floor=low_floor,
                lowest_margin=low_margin, candidates=table)
    hold = lambda reason: MultiRecommendation(**base, recommended_floor=None, recommended_margin=None,
                                              action="hold", reason=reason)
    wait = _not_yet(decisions, last_change_ms, now_ms, g)
    if wait is not None:
        return hold(wait)
    if unknown:
        return hold(f"events of config version(s) {unknown} have no recorded config: their score floor / "
                    "answer margin is unknown, so other values cannot be replayed")
    if low_floor is None:
        return hold("no logged mixed scores: nothing to replay")
    table["feasible"] = (table["replayable"] & (table["labelled"] >= g.min_labelled)
                         & (table["false_hit_upper"] <= g.target_false_hit_rate))
    feasible = table[table["feasible"]]
    if not feasible.empty:
        # Pairs the logs cannot tell apart (same estimated hits) go to the smallest move:
        # a move that changes nothing on the logs would only spend the cool-down.
        ranked = feasible.assign(move=((feasible["score_floor"] - score_floor).abs()
                                       + (feasible["answer_margin"] - answer_margin).abs()).round(6))
        best = ranked.sort_values(["est_hits", "move", "score_floor", "answer_margin"],
                                  ascending=[False, True, False, False]).iloc[0]
        return _multi_recommendation(base, best, "best hit rate with the false-hit bound under target")
    if _over_target(now_row, g):
        same_margin = table[(table["answer_margin"] - answer_margin).abs() < 1e-9]
        return _multi_recommendation(base, same_margin.loc[same_margin["score_floor"].idxmax()],
                                     f"false-hit bound {now_row['false_hit_upper']:.1%} above target "
                                     f"{g.target_false_hit_rate:.1%} and no candidate is safe: raising the "
                                     "score floor by the max step")
    return hold(f"no replayable floor / margin has {g.min_labelled}+ labelled hits with the false-hit bound "
                f"under {g.target_false_hit_rate:.1%}")


def multi_exploration(rec: MultiRecommendation, failed: RolledBack | None = None) -> MultiRecommendation | None:
    """``exploration`` for a multi arm's score floor: when ``recommend_multi`` holds at the
    current pair because it is the best replayable one, the lowest floor under it (same
    margin) the logs cannot replay, if the logged scores say it would serve more. Only ever
    try it on a canary (``control.start_multi_canary``). ``failed``: as in ``exploration``,
    for the score floor a rolled-back canary tried."""
    if (rec.recommended_floor is None or abs(rec.recommended_floor - rec.current_floor) > 1e-9
            or abs(rec.recommended_margin - rec.current_margin) > 1e-9):
        return None
    table = rec.candidates
    same_margin = table[(table["answer_margin"] - rec.current_margin).abs() < 1e-9]
    step, note = _explore_step(same_margin, "score_floor", rec.current_floor, "replayable", failed)
    if step is None:
        return replace(rec, reason=rec.reason + note) if note else None
    return replace(rec, recommended_floor=float(step["score_floor"]), action="explore",
                   recommended_hit_rate=step["est_hit_rate"],
                   reason=f"exploring score floor {step['score_floor']:.3f} on a canary: {rec.current_floor:.3f} "
                          f"is the best replayable floor (false-hit bound {rec.false_hit_upper:.1%} at "
                          f"{rec.labelled} labels) and the logs cannot replay below it{note}")


def _multi_recommendation(base: dict, row: pd.Series, why: str) -> MultiRecommendation:
    floor, margin = float(row["score_floor"]), float(row["answer_margin"])
    moved = abs(floor - base["current_floor"]) > 1e-9 or abs(margin - base["current_margin"]) > 1e-9
    return MultiRecommendation(
        **base, recommended_floor=floor, recommended_margin=margin, action="change" if moved else "hold",
        reason=why if moved else "the current floor and margin are already the best within the guardrails",
        recommended_hit_rate=row["est_hit_rate"], false_hit_rate=row["false_hit_rate"],
        false_hit_upper=row["false_hit_upper"], labelled=int(row["labelled"]))


def recommend_multi_all(config: ExperimentConfig, score_hist: pd.DataFrame, configs: dict[int, ExperimentConfig],
                        guardrails: Guardrails, *, now_ms: int,
                        last_change_ms: dict[str, int] | None = None) -> list[MultiRecommendation]:
    """``recommend_multi`` for every multi arm of ``config`` without a running canary
    (``configs``: every known config by version, see ``configs_by_version``)."""
    last = last_change_ms or {}
    return [recommend_multi(arm.name, arm.multi.threshold, arm.multi.answer_margin, _narrow(score_hist, arm.name, None),
                            logged_rules(configs, arm.name), guardrails, now_ms=now_ms,
                            last_change_ms=last.get(arm.name))
            for arm in config.arms if arm.similarity == "multi" and arm.canary is None]
