"""Score floor and answer margin of multi-similarity arms: guarded recommendations.

``recommend_multi`` tunes a multi arm's score floor and answer margin together with the
objective and guardrails of ``tuning.recommend``, from queries.multi_score_histogram
(cosine gate as logged): the floor / margin in force decided only whether the best-ranked
candidate was served, so a pair at or above the lowest ones the window was logged at
(known per config version from the audit) replays: what it serves passed the logged pair,
so its guard verdict and label are in the log (exact when the window ran one pair). Pairs
under them are never recommended. ``multi_exploration`` tries a lower floor on a canary
when the arm is held at its best replayable pair.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import pandas as pd

from cache_core.decision.thresholds import multi_for
from cache_core.experiments import ExperimentConfig
from dashboard.control.canary import RolledBack
from dashboard.control.guardrails import Action, Guardrails
from dashboard.control.tuning import explore_step, narrow, not_yet, over_target, candidate_grid
from dashboard.control.whatif import multi_table


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


def recommend_multi(arm: str, score_floor: float, answer_margin: float, score_hist: pd.DataFrame,
                    rules: dict[int, tuple[float, float]], guardrails: Guardrails, *, now_ms: int,
                    last_change_ms: int | None = None) -> MultiRecommendation:
    """The guarded best score floor and answer margin of one multi arm.

    The objective and guard rails of ``recommend``: the pair with the highest estimated hit
    rate whose time-uniform upper bound of the false-hit rate (labelled hits the pair
    would serve; alpha split over every candidate pair, ``whatif.split_upper_bounds``) is <= the target with ``min_labelled`` labels; each of floor and
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
    wait = not_yet(decisions, last_change_ms, now_ms, g)
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
    if over_target(now_row, g):
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
    try it on a canary (``changes.start_multi_canary``). ``failed``: as in ``exploration``,
    for the score floor a rolled-back canary tried."""
    if (rec.recommended_floor is None or abs(rec.recommended_floor - rec.current_floor) > 1e-9
            or abs(rec.recommended_margin - rec.current_margin) > 1e-9):
        return None
    table = rec.candidates
    same_margin = table[(table["answer_margin"] - rec.current_margin).abs() < 1e-9]
    step, note = explore_step(same_margin, "score_floor", rec.current_floor, "replayable", failed)
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
    return [recommend_multi(arm.name, arm.multi.threshold, arm.multi.answer_margin, narrow(score_hist, arm.name, None),
                            logged_rules(configs, arm.name), guardrails, now_ms=now_ms,
                            last_change_ms=last.get(arm.name))
            for arm in config.arms if arm.similarity == "multi" and arm.canary is None]
