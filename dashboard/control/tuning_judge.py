"""Auto-tune of a judged arm's operating point (issue 25 part 4), as ``tuning`` tunes thresholds.

A judged arm (``judge: {version, max_false_hit_rate | accept_at}``) serves the best candidate above
its cosine floor when the judge's probability reaches the cut. Every judged decision logs that
probability (``judge_probability``, with ``judge_version``), so a cut ``c`` replays exactly: at the
same floor and candidates, the decisions served at ``c`` are those with probability >= c
(``queries.judge_probabilities``: hits and judge vetoes per probability bin, of the arm's current
judge version only: another version's probabilities mean something else).

Candidates are cuts within ``max_step`` of the current one on a ``grid`` (probability, not cosine,
steps). Each gets the estimate of ``shadow_estimates`` from each source, apart, at half the alpha
split over the candidates (the same time-uniform bound as thresholds): the decisions served at ``c``
are those that were hits (their users' verdicts, or shadow hit checks, estimate them) and those the
judge vetoed (only shadow checks judge them: a veto with a nearest answer is a near-miss to
``cache_core.shadow``). Users alone therefore never support a cut below the logged one, exactly as
with thresholds; shadow near-miss checks do. ``tuning.feasibility`` picks as for thresholds: the
highest estimated hit rate among cuts a source bounds under the target, none measured over it.

A loosening (a lower cut) goes out as a canary (``changes.start_judge_canary``: the canary units use
the same judge at the new cut), promoted or rolled back by ``canary.evaluate_canary`` like any canary;
a tightening is pushed directly (``changes.set_judge_cut``), as is a raise when the current cut is
measured over the target. The current cut is the arm's ``accept_at``, else the artifact's held-out
cut for its ``max_false_hit_rate`` (``current_cut``; unreadable artifact: hold, say why).
Not done: explorations below what any verdict supports (thresholds have them; a judged arm with no
shadow checks holds instead), and per-cluster cuts.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cache_core.experiments import ArmConfig, ExperimentConfig, JudgeConfig
from dashboard.control.guardrails import Action, Guardrails
from dashboard.control.shadow_estimates import shadow_table
from dashboard.control.tuning import feasibility, not_yet, over_target

GRID = 0.01
"""Step between candidate cuts (probability)."""
MAX_STEP = 0.05
"""Largest change of a cut in one push."""


@dataclass(frozen=True)
class JudgeRecommendation:
    arm: str
    version: str
    current: float | None
    """The cut in force (None: unknown, see ``reason``)."""
    recommended: float | None
    action: Action
    reason: str
    basis: str = ""
    false_hit_upper: float | None = None
    labelled: int = 0
    shadow_labelled: int = 0
    current_hit_rate: float | None = None
    recommended_hit_rate: float | None = None
    """Estimated share of the judged decisions served (hits / decisions that reached the judge)."""
    candidates: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False, compare=False)

    @property
    def loosens(self) -> bool:
        return self.recommended is not None and self.current is not None and self.recommended < self.current - 1e-9


def current_cut(judge: JudgeConfig, judge_dir: Path) -> tuple[float | None, str]:
    """The cut an arm's judge applies: its ``accept_at``, else the artifact's cut for
    ``max_false_hit_rate`` read from ``judge_dir``; (None, why) when it cannot be read."""
    if judge.accept_at is not None:
        return judge.accept_at, ""
    from cache_core.decision.judge_model import JudgeArtifact, JudgeLoadError, artifact_name
    try:
        artifact = JudgeArtifact.load(judge_dir / artifact_name(judge.version), check_encoder=False)
        return artifact.accept_at(judge.max_false_hit_rate), ""
    except (JudgeLoadError, ValueError) as exc:
        return None, f"the cut for max_false_hit_rate {judge.max_false_hit_rate} is unknown here: {exc}"


def _frames(probabilities: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """queries.judge_probabilities rows of one arm x version as (histogram, users' verdicts, shadow
    verdicts) in the shape ``shadow_estimates.shadow_table`` reads (probability bins as similarity bins)."""
    p = probabilities
    bins = p["probability_milli"].astype("int64")
    hist = pd.DataFrame({"similarity_milli": bins, "decisions": p["decisions"], "hits": p["hits"],
                         "guard_blocks": 0})
    users = pd.DataFrame({"decision": "hit", "similarity_milli": bins, "correct": p["user_correct"],
                          "wrong": p["user_wrong"]})
    shadow = pd.concat([
        pd.DataFrame({"decision": "hit", "similarity_milli": bins, "correct": p["shadow_hit_correct"],
                      "wrong": p["shadow_hit_wrong"]}),
        pd.DataFrame({"decision": "miss", "similarity_milli": bins, "correct": p["shadow_miss_correct"],
                      "wrong": p["shadow_miss_wrong"]})], ignore_index=True)
    return hist, users, shadow


def cut_grid(current: float, grid: float = GRID, max_step: float = MAX_STEP) -> np.ndarray:
    steps = int(np.floor(max_step / grid + 1e-9))
    return np.unique(np.round(np.clip(current + grid * np.arange(-steps, steps + 1), 0.0, 1.0), 6))


def cut_table(probabilities: pd.DataFrame, cuts, alpha: float) -> pd.DataFrame:
    """Per candidate cut: estimated hits among the judged decisions, and the users' and the shadow
    estimate (columns as ``tuning.candidate_table``, so ``tuning.feasibility`` reads it)."""
    cuts = list(cuts)
    hist, users, shadow = _frames(probabilities)
    split = alpha / 2 / max(len(cuts), 1)
    mine = shadow_table(hist, users, cuts, split).rename(columns={
        "shadow_labelled": "labelled", "shadow_wrong": "wrong", "shadow_false_hit_rate": "false_hit_rate",
        "shadow_false_hit_upper": "false_hit_upper", "shadow_supported": "supported"})
    theirs = shadow_table(hist, shadow, cuts, split)
    decisions = int(hist["decisions"].sum())
    served = [int(hist.loc[hist["similarity_milli"] >= int(np.ceil(c * 1000 - 1e-9)), "decisions"].sum()) for c in cuts]
    table = pd.DataFrame({"threshold": [round(float(c), 6) for c in cuts], "decisions": decisions,
                          "est_hits": served,
                          "est_hit_rate": [s / decisions if decisions else None for s in served]})
    table = pd.concat([table, mine[["labelled", "wrong", "false_hit_rate", "false_hit_upper", "supported"]],
                       theirs.drop(columns="threshold")], axis=1)
    table["false_hit_upper"] = table["false_hit_upper"].astype("float64")
    table["false_hit_rate"] = table["false_hit_rate"].astype("float64")
    return table


def recommend_cut(arm: str, version: str, current: float, probabilities: pd.DataFrame, guardrails: Guardrails, *,
                  now_ms: int, last_change_ms: int | None = None, grid: float = GRID,
                  max_step: float = MAX_STEP) -> JudgeRecommendation:
    """The guarded best cut for one judged arm; ``probabilities``: its rows of the current version."""
    g = guardrails
    table = feasibility(cut_table(probabilities, cut_grid(current, grid, max_step), g.alpha), g)
    now_row = table.loc[(table["threshold"] - current).abs().idxmin()]
    base = dict(arm=arm, version=version, current=current, current_hit_rate=now_row["est_hit_rate"],
                candidates=table)
    wait = not_yet(int(table["decisions"].iloc[0]) if not table.empty else 0, last_change_ms, now_ms, g)
    if wait is not None:
        return JudgeRecommendation(**base, recommended=None, action="hold", reason=wait.replace("decisions",
                                                                                                "judged decisions"))
    feasible = table[table["feasible"]]
    if feasible.empty:
        if over_target(now_row, g):
            return _pick(base, table.iloc[-1], f"the false-hit rate at cut {current:.3f} is over the target "
                         f"{g.target_false_hit_rate:.1%} and no cut is safe: raising by the max step")
        return JudgeRecommendation(**base, recommended=None, action="hold",
                                   reason=f"no cut has {g.min_labelled}+ verdicts with the false-hit bound under "
                                          f"{g.target_false_hit_rate:.1%}")
    best = feasible.sort_values(["est_hit_rate", "threshold"], ascending=[False, False]).iloc[0]
    why = "best hit rate with the false-hit bound under target"
    if best["basis"] == "shadow":
        why += (f" (rests on shadow verdicts: {int(best['shadow_hit_checks'])} hit and "
                f"{int(best['shadow_near_miss_checks'])} judge-veto checks)")
    return _pick(base, best, why)


def _pick(base: dict, row: pd.Series, why: str) -> JudgeRecommendation:
    cut = float(row["threshold"])
    moved = abs(cut - base["current"]) > 1e-9
    basis = row.get("basis", "") or ""
    bound = row["shadow_false_hit_upper"] if basis == "shadow" else row["false_hit_upper"]
    return JudgeRecommendation(**base, recommended=cut, action="change" if moved else "hold",
                               reason=why if moved else "the current cut is already the best within the guardrails",
                               basis=basis, false_hit_upper=None if pd.isna(bound) else float(bound),
                               labelled=int(row["labelled"]), shadow_labelled=int(row["shadow_labelled"]),
                               recommended_hit_rate=row["est_hit_rate"])


def recommend_cuts(config: ExperimentConfig, probabilities: pd.DataFrame, guardrails: Guardrails, *,
                   now_ms: int, cut_of: Callable[[JudgeConfig], tuple[float | None, str]],
                   last_change_ms: dict[str, int] | None = None) -> list[JudgeRecommendation]:
    """One recommendation per judged arm without a running canary (``cut_of``: ``current_cut`` bound
    to the judge directory)."""
    out = []
    for arm in config.arms:
        if arm.judge is None or arm.canary is not None:
            continue
        out.append(_for_arm(arm, probabilities, guardrails, now_ms, cut_of, (last_change_ms or {}).get(arm.name)))
    return out


def _for_arm(arm: ArmConfig, probabilities: pd.DataFrame, g: Guardrails, now_ms: int, cut_of,
             last_ms: int | None) -> JudgeRecommendation:
    version = arm.judge.version
    current, why = cut_of(arm.judge)
    if current is None:
        return JudgeRecommendation(arm.name, version, None, None, "hold", why)
    mine = probabilities[(probabilities["arm"] == arm.name) & (probabilities["judge_version"] == version)] \
        if not probabilities.empty else probabilities
    if mine.empty:
        return JudgeRecommendation(arm.name, version, current, None, "hold",
                                   f"no judged decisions of {version} in the lookback window")
    return recommend_cut(arm.name, version, current, mine, g, now_ms=now_ms, last_change_ms=last_ms)
