"""The false-hit rate from a designed random sample: shadow checks, weighted by inclusion probability.

Users' verdicts are ground truth for the hits they judge, but nobody chose those hits: users
label when they care to, and if they say "wrong" half as often as "right" relative to reality,
the rate from their verdicts is biased and no weighting can tell (issue 26, item 4). A shadow
check (``cache_core.shadow``) is a hit picked by the service: each hit is drawn with the known
share ``SCACHE_SHADOW__HIT_RATE``, then kept if the arm's budget (``calls_per_minute``) and the
queue have room. The draw is random; the budget is not uniform over time (a busy hour drops
more draws than a quiet one), so the unweighted share wrong over-weights quiet hours.

Here each arm x hour is a stratum whose inclusion probability is known from the counts:
pi_h = checked_h / hits_h (the draw at a fixed share, thinned by the budget, uniformly within
the hour). The estimate is the ratio (Hajek) estimator weighting each checked hit by 1 / pi_h:

    p = sum_h hits_h * wrong_h / checked_h  /  sum_h hits_h        (strata with a check)

with the stratified variance sum_h (hits_h / H)^2 p_h (1 - p_h) / checked_h (checks as
independent draws within an hour) and a normal interval clipped to [0, 1]. Hours with hits
but no check are left out and reported (``coverage``: the share of hits in checked hours).
The estimate is only as good as the equivalence check behind a shadow verdict
(SCACHE_SHADOW__EQUIVALENCE): the page says which estimate each number uses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from dashboard.control.stats import DEFAULT_ALPHA, _z_critical

BASIS_USERS = "users' verdicts (self-selected: biased if users report wrong and right answers unequally)"
BASIS_SHADOW = "shadow checks, weighted by inclusion per hour (a random sample of hits)"


@dataclass(frozen=True)
class WeightedRate:
    rate: float | None
    low: float | None
    high: float | None
    checked: int
    """Shadow-checked hits behind the estimate."""
    coverage: float | None
    """Share of the arm's hits in hours with at least one check."""


def weighted_rate(strata: pd.DataFrame, alpha: float = DEFAULT_ALPHA) -> WeightedRate:
    """The inclusion-weighted false-hit rate of one arm from ``queries.shadow_strata`` rows
    (epoch_hour, hits, checked, wrong); see the module docstring."""
    if strata.empty or int(strata["hits"].sum()) == 0:
        return WeightedRate(None, None, None, 0, None)
    hits = strata["hits"].astype("float64")
    checked = strata["checked"].astype("float64")
    seen = checked > 0
    total = float(hits[seen].sum())
    n = int(checked.sum())
    if total == 0:
        return WeightedRate(None, None, None, n, 0.0)
    p_h = strata.loc[seen, "wrong"].astype("float64") / checked[seen]
    weight = hits[seen] / total
    rate = float((weight * p_h).sum())
    variance = float((weight ** 2 * p_h * (1 - p_h) / checked[seen]).sum())
    half = _z_critical(alpha) * math.sqrt(variance)
    return WeightedRate(rate, max(0.0, rate - half), min(1.0, rate + half), n, total / float(hits.sum()))


def estimates_frame(false_hits: pd.DataFrame | None, strata: pd.DataFrame | None,
                    alpha: float = DEFAULT_ALPHA) -> pd.DataFrame:
    """Per arm, the two false-hit estimates side by side with what each rests on: users' verdicts
    (``queries.false_hits``, as every test and auto-tune uses them) and the inclusion-weighted shadow
    estimate with its interval. Empty when neither has a verdict."""
    columns = ["arm", "estimate", "false_hit_rate", "low", "high", "verdicts", "coverage", "basis"]
    rows = []
    if false_hits is not None and not false_hits.empty:
        for arm, part in false_hits.groupby("arm"):
            n, wrong = int(part["correct"].sum() + part["wrong"].sum()), int(part["wrong"].sum())
            rows.append({"arm": arm, "estimate": "users", "false_hit_rate": wrong / n if n else None,
                         "low": None, "high": None, "verdicts": n, "coverage": None, "basis": BASIS_USERS})
    if strata is not None and not strata.empty:
        for arm, part in strata.groupby("arm"):
            w = weighted_rate(part, alpha)
            if w.checked:
                rows.append({"arm": arm, "estimate": "shadow, weighted", "false_hit_rate": w.rate, "low": w.low,
                             "high": w.high, "verdicts": w.checked, "coverage": w.coverage, "basis": BASIS_SHADOW})
    if not rows:
        return pd.DataFrame(columns=columns)
    return pd.DataFrame(rows, columns=columns).sort_values(["arm", "estimate"]).reset_index(drop=True)
