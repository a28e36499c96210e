"""Threshold recommendations, free of any UI or I/O.

``recommend`` picks, for one arm (or one intent cluster of it), the threshold with
the highest estimated hit rate whose false-hit rate stays under the operator's
target with confidence: the time-uniform (1 - alpha) upper bound of the false-hit rate
among feedback-labelled hits at or above the threshold, split over the candidates, must
be <= target (``whatif.threshold_table``; labels only from decisions logged at a threshold
at or below the candidate). Guardrails: enough traffic and labels, at most ``max_step`` per change,
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
(The replays themselves are in ``whatif``; a multi arm's score floor and answer margin are
tuned by ``tuning_multi``, canaries judged by ``canary``.)

Shadow verdicts (``shadow_labelled``, optional): hit checks and near-miss checks give a second
estimate per candidate, kept apart from the users' (``shadow_estimates``: near-misses make the
curve below the current threshold measurable without a canary). Each source's bound is then at
half the alpha. A candidate is feasible when a source with enough verdicts (``min_labelled``) that
covers it puts its bound under the target, and no source with enough verdicts that covers it
measures it over the target (its point estimate: the two may disagree, e.g. an equivalence check
stricter than users, and then the worse one wins); ``basis`` says which source(s) a recommendation
rests on. Multi arms use users' verdicts only.

Re-runs: the bound is time-uniform over the looks at one growing sample and split over the
candidates of a pass (at 1 wrong of 156 labels and 13 candidates it is 7.2% where a one-pass
Clopper-Pearson bound is 3.0%: it needs more labels). ``autotune --every`` reads a rolling
window, not one growing sample, so the bound alone proves nothing over a week of re-runs.
What holds the level there is the route: every change an arm's threshold gets goes out as a
canary judged by the exact always-valid test of ``canary`` (a fresh sequential test of the
value itself), a lower one is never pushed directly (``rollout``), and a rolled-back value is
not retried for a week. Measured, not proven (``python -m bench.autotune_week``: hourly
re-runs for a simulated week, clustered users at ICC 0.05 / 0.2, hit rates 2-80%, 200 weeks
each): a truly over-target threshold was promoted in 0-0.5% of weeks (alpha 0.05) and
recommended as a change in none; explorations try one on a canary by design. Labels are
taken as a random sample of hits (issue 26, item 4: ``shadow_estimate`` weights shadow checks
by inclusion probability on the overview; the week above used users' verdicts only), and the estimated hit
rate holds the cache's contents fixed (a cache stores an entry on each miss, so a lower
threshold also changes what is stored): every lowering says so (``FIXED_CONTENTS``), and
its canary is promoted only when the measured hit rate confirms the gain (``canary_gain``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import pandas as pd

from cache_core.decision.thresholds import threshold_for
from cache_core.experiments import ExperimentConfig
from dashboard.control.canary import RolledBack
from dashboard.control.guardrails import Action, Guardrails
from dashboard.control.shadow_estimates import shadow_table
from dashboard.control.whatif import threshold_table

Basis = Literal["users", "shadow", "users + shadow", ""]


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
    basis: Basis = ""
    """Whose verdicts the recommended value's bound rests on ("shadow": shadow checks', near-misses
    included; "": no bound, e.g. a hold for traffic)."""
    shadow_labelled: int = 0
    """Shadow verdicts (hit and near-miss checks) at or above the recommended value."""


def candidate_grid(current: float, guardrails: Guardrails, low: float = 0.0, high: float = 1.0) -> np.ndarray:
    """Values within ``max_step`` of ``current`` on the grid, current included, inside [low, high]."""
    steps = int(math.floor(guardrails.max_step / guardrails.grid_step + 1e-9))
    grid = current + guardrails.grid_step * np.arange(-steps, steps + 1)
    return np.unique(np.round(np.clip(grid, low, high), 6))


def not_yet(decisions: int, last_change_ms: int | None, now_ms: int, g: Guardrails) -> str | None:
    """Why no change may be recommended yet (too few decisions, cool-down), or None."""
    if decisions < g.min_decisions:
        return f"only {decisions} logged decisions, need {g.min_decisions}"
    if last_change_ms is not None and now_ms - last_change_ms < g.cooldown_s * 1000:
        waited = (now_ms - last_change_ms) / 1000
        return f"cool-down: last change {waited:.0f}s ago, need {g.cooldown_s:.0f}s"
    return None


def over_target(now_row: pd.Series, g: Guardrails) -> bool:
    """Enough labels at the current setting, and its false-hit bound is above the target (the users',
    or, when the row has them, the shadow checks')."""
    users = bool(now_row["labelled"] >= g.min_labelled and now_row["false_hit_upper"] is not None
                 and now_row["false_hit_upper"] > g.target_false_hit_rate)
    return users or bool("shadow_supported" in now_row and _shadow_says(now_row, g, over=True))


def _shadow_says(row: pd.Series, g: Guardrails, over: bool = False) -> bool | None:
    """With enough shadow verdicts covering the row: its bound under the target (True / False), or with
    ``over``, its point estimate over the target; None: no say."""
    if not row["shadow_supported"] or row["shadow_labelled"] < g.min_labelled:
        return None
    if over:
        return bool(row["shadow_false_hit_rate"] > g.target_false_hit_rate)
    return bool(row["shadow_false_hit_upper"] <= g.target_false_hit_rate)


def feasibility(table: pd.DataFrame, g: Guardrails) -> pd.DataFrame:
    """``feasible`` and ``basis`` per candidate row (see the module docstring)."""
    table = table.copy()
    users_enough = table["supported"] & (table["labelled"] >= g.min_labelled)
    users_ok = users_enough & (table["false_hit_upper"] <= g.target_false_hit_rate)
    if "shadow_supported" not in table:
        table["feasible"], table["basis"] = users_ok, np.where(users_ok, "users", "")
        return table
    table["known"] = table["supported"] | table["shadow_supported"]
    shadow_ok = table.apply(lambda row: _shadow_says(row, g), axis=1).eq(True)
    shadow_over = table.apply(lambda row: _shadow_says(row, g, over=True), axis=1).eq(True)
    users_over = users_enough & (table["false_hit_rate"].astype("float64") > g.target_false_hit_rate)
    table["feasible"] = (users_ok | shadow_ok) & ~users_over & ~shadow_over
    table["basis"] = np.select([users_ok & shadow_ok, users_ok, shadow_ok], ["users + shadow", "users", "shadow"], "")
    return table


def candidate_table(similarity_hist: pd.DataFrame, labelled: pd.DataFrame, thresholds, g: Guardrails,
                    shadow_labelled: pd.DataFrame | None = None) -> pd.DataFrame:
    """``whatif.threshold_table`` (users' verdicts) and, with ``shadow_labelled``, the shadow columns
    of ``shadow_estimates.shadow_table`` beside it, each at half the alpha."""
    if shadow_labelled is None:
        return threshold_table(similarity_hist, labelled, thresholds, g.alpha)
    thresholds = list(thresholds)
    split = g.alpha / 2 / max(len(thresholds), 1)
    table = threshold_table(similarity_hist, labelled, thresholds, g.alpha / 2)
    shadow = shadow_table(similarity_hist, shadow_labelled, thresholds, split)
    return pd.concat([table, shadow.drop(columns="threshold")], axis=1)


def recommend(arm: str, current: float, similarity_hist: pd.DataFrame, labelled: pd.DataFrame,
              guardrails: Guardrails, *, now_ms: int, last_change_ms: int | None = None,
              cluster: int | None = None, shadow_labelled: pd.DataFrame | None = None) -> Recommendation:
    """The guarded best threshold for one arm (or cluster); see the module docstring."""
    g = guardrails
    table = candidate_table(similarity_hist, labelled, candidate_grid(current, g), g, shadow_labelled)
    now_row = table.loc[(table["threshold"] - current).abs().idxmin()]
    base = dict(arm=arm, cluster=cluster, current=current, current_hit_rate=now_row["est_hit_rate"],
                candidates=table)
    decisions = int(table["decisions"].iloc[0]) if not table.empty else 0
    wait = not_yet(decisions, last_change_ms, now_ms, g)
    if wait is not None:
        return Recommendation(**base, recommended=None, action="hold", reason=wait)
    table = feasibility(table, g)
    base["candidates"] = table
    feasible = table[table["feasible"]]
    if feasible.empty:
        return _no_feasible(base, table, now_row, g)
    best = feasible.sort_values(["est_hit_rate", "threshold"], ascending=[False, False]).iloc[0]
    why = "best hit rate with the false-hit bound under target"
    if best["basis"] == "shadow":
        why += (f" (rests on shadow verdicts: {int(best['shadow_hit_checks'])} hit and "
                f"{int(best['shadow_near_miss_checks'])} near-miss checks)")
    return _recommendation(base, best, current, why)


FIXED_CONTENTS = ("estimated hit rates replay logged decisions with the cache's contents held fixed (a lower "
                  "threshold also stores fewer entries): the canary's measured hit rate must confirm the gain")
"""Said with every lowering (issue 26, item 5); ``canary_gain`` holds the promotion until it does."""


def _recommendation(base: dict, row: pd.Series, current: float, why: str) -> Recommendation:
    recommended = float(row["threshold"])
    moved = abs(recommended - current) > 1e-9
    basis = row.get("basis", "users") or ""
    bound = row["shadow_false_hit_upper"] if basis == "shadow" else row["false_hit_upper"]
    if recommended < current - 1e-9:
        why = f"{why}; {FIXED_CONTENTS}"
    return Recommendation(
        **base, recommended=recommended, action="change" if moved else "hold",
        reason=why if moved else "the current threshold is already the best within the guardrails",
        recommended_hit_rate=row["est_hit_rate"], false_hit_upper=bound,
        labelled=int(row["labelled"]), basis=basis, shadow_labelled=int(row.get("shadow_labelled", 0)))


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


def explore_step(table: pd.DataFrame, column: Literal["threshold", "score_floor"], current: float, known: str,
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
    known = "known" if "known" in rec.candidates else "supported"  # shadow-covered candidates are not unknown
    step, note = explore_step(rec.candidates, "threshold", rec.current, known, failed)
    if step is None:
        return replace(rec, reason=rec.reason + note) if note else None
    return replace(rec, recommended=float(step["threshold"]), action="explore",
                   recommended_hit_rate=step["est_hit_rate"],
                   reason=f"exploring {step['threshold']:.3f} on a canary: {rec.current:.3f} is the best supported "
                          f"threshold (false-hit bound {rec.false_hit_upper:.1%} at {rec.labelled} labels) and no "
                          f"labels reach below it{note}; {FIXED_CONTENTS}")


def _no_feasible(base: dict, table: pd.DataFrame, now_row: pd.Series, g: Guardrails) -> Recommendation:
    if over_target(now_row, g):  # over target at the current threshold: step up as far as allowed
        return _recommendation(base, table.iloc[-1], base["current"],
                               f"false-hit bound {now_row['false_hit_upper']:.1%} above target "
                               f"{g.target_false_hit_rate:.1%} and no candidate is safe: raising by the max step")
    return Recommendation(**base, recommended=None, action="hold",
                          reason=f"no candidate has {g.min_labelled}+ labelled hits with the "
                                 f"false-hit bound under {g.target_false_hit_rate:.1%}")


def narrow(df: pd.DataFrame, arm: str, cluster: int | None) -> pd.DataFrame:
    out = df[df["arm"] == arm] if not df.empty else df
    if cluster is not None and not out.empty:
        out = out[out["intent_cluster"] == cluster]
    return out


def recommend_all(config: ExperimentConfig, similarity_hist: pd.DataFrame, labelled: pd.DataFrame,
                  guardrails: Guardrails, *, now_ms: int, last_change_ms: dict[str, int] | None = None,
                  clusters: bool = False, shadow_labelled: pd.DataFrame | None = None) -> list[Recommendation]:
    """One recommendation per arm (and, with ``clusters``, per intent cluster seen in the data).

    Arms with a running canary are skipped: the canary is evaluated first; so are judged arms (their
    threshold is a floor under the judge: ``tuning_judge`` tunes their cut). ``shadow_labelled``
    (queries.shadow_labelled) adds the shadow estimates for cosine arms.
    """
    last = last_change_ms or {}
    out = []
    for arm in config.arms:
        if arm.canary is not None or arm.judge is not None:  # a judged arm's cut is tuned by tuning_judge
            continue
        targets: list[int | None] = [None]
        if clusters and not similarity_hist.empty:
            seen = similarity_hist.loc[similarity_hist["arm"] == arm.name, "intent_cluster"]
            targets += sorted(int(c) for c in seen.unique() if c >= 0)
        for cluster in targets:
            shadow = None if shadow_labelled is None or arm.similarity == "multi" else \
                narrow(shadow_labelled, arm.name, cluster)
            out.append(recommend(arm.name, threshold_for(arm, cluster), narrow(similarity_hist, arm.name, cluster),
                                 narrow(labelled, arm.name, cluster), guardrails, now_ms=now_ms,
                                 last_change_ms=last.get(arm.name), cluster=cluster, shadow_labelled=shadow))
    return out


# -- multi arms: score floor and answer margin ------------------------------------------













