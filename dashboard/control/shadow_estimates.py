"""The false-hit rate at a candidate threshold from shadow verdicts, near-misses included (issue 25).

Users label only hits, so below the lowest labelled similarity the users' false-hit rate is unknown
(``whatif.threshold_table`` marks it unsupported and tuning only gets there through a canary). Shadow
checks (``cache_core.shadow``) also judge near-misses: misses whose nearest candidate was just below
the threshold, "had it been served, would it have been right". With them the curve below the current
threshold is measured without a canary.

At a candidate ``t`` the decisions a threshold ``t`` would serve (similarity >= t, not guard-blocked)
are of two parts, sampled at different rates (``SCACHE_SHADOW__HIT_RATE`` and ``NEAR_MISS_RATE``),
so their verdicts are never pooled:

* ``H``: those that were served (logged hits), whose hit checks estimate their false-hit rate ``p_h``;
* ``M``: those that were misses, whose near-miss checks estimate ``p_m``.

The estimate is ``(H p_h + M p_m) / (H + M)``, and its upper bound the same mixture of each part's
time-uniform bound (``target_test.upper_confidence_bound``) at half the alpha: both hold together with
probability 1 - alpha, so the mixture does. ``supported``: every part with decisions has verdicts, and
the near-miss verdicts reach down to ``t`` (a miss under the near-miss band is never checked, so a
``t`` below the lowest checked one would count unjudged decisions as judged).

Assumed, as for the users' verdicts: each part's checks are a random sample of it (they are, by
``random()`` draws within the budget, unless the budget runs dry unevenly over time). Multi arms are
left out (their decisions depend on scores logged only past the gate; ``whatif`` covers them).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dashboard.control.stats import ProportionStat
from dashboard.control.target_test import upper_confidence_bound
from dashboard.control.whatif import BIN_WIDTH, _at_or_above, _bins, servable

COLUMNS = ["threshold", "shadow_labelled", "shadow_wrong", "shadow_hit_checks", "shadow_near_miss_checks",
           "shadow_false_hit_rate", "shadow_false_hit_upper", "shadow_supported"]


def _part_bound(n: int, wrong: int, alpha: float) -> tuple[float | None, float]:
    """(rate, upper bound) of one part's verdicts; no verdicts: (None, 1.0)."""
    if n <= 0:
        return None, 1.0
    stat = ProportionStat(n, wrong)
    return stat.rate, upper_confidence_bound(stat, alpha)


def shadow_table(similarity_hist: pd.DataFrame, shadow: pd.DataFrame, thresholds, alpha: float) -> pd.DataFrame:
    """Per candidate threshold: the shadow estimate of the module docstring. ``similarity_hist``
    (queries.similarity_histogram) and ``shadow`` (queries.shadow_labelled) narrowed to one arm (and
    cluster); ``alpha`` already split over the candidates as the caller splits it."""
    thresholds = np.asarray(list(thresholds), dtype="float64")
    hist = similarity_hist
    if hist.empty:
        counts = pd.DataFrame(columns=["similarity_milli", "servable", "hits"])
    else:
        counts = _bins(hist.assign(servable=servable(hist)), ["servable", "hits"])
    serve = _at_or_above(counts, "servable", thresholds)
    served = np.minimum(_at_or_above(counts, "hits", thresholds), serve)
    verdicts = {}
    for decision in ("hit", "miss"):
        part = shadow[shadow["decision"] == decision] if not shadow.empty else shadow
        verdicts[decision] = _bins(part, ["correct", "wrong"])
    near = verdicts["miss"]
    near = near[(near["correct"] + near["wrong"]) > 0] if not near.empty else near
    lowest_near = near["similarity_milli"].min() * BIN_WIDTH if not near.empty else math.inf
    rows = []
    for i, t in enumerate(thresholds):
        at = np.array([t])
        h_wrong = int(_at_or_above(verdicts["hit"], "wrong", at)[0])
        h_n = h_wrong + int(_at_or_above(verdicts["hit"], "correct", at)[0])
        m_wrong = int(_at_or_above(verdicts["miss"], "wrong", at)[0])
        m_n = m_wrong + int(_at_or_above(verdicts["miss"], "correct", at)[0])
        h, m = int(served[i]), int(serve[i] - served[i])
        h_rate, h_upper = _part_bound(h_n, h_wrong, alpha / 2)
        m_rate, m_upper = _part_bound(m_n, m_wrong, alpha / 2)
        total = h + m
        supported = total > 0 and (h == 0 or h_n > 0) and (m == 0 or (m_n > 0 and t >= lowest_near - 1e-9))
        rate = upper = None
        if supported:
            rate = ((h * h_rate if h else 0.0) + (m * m_rate if m else 0.0)) / total
            upper = (h * h_upper + m * m_upper) / total
        rows.append({"threshold": round(float(t), 6), "shadow_labelled": h_n + m_n, "shadow_wrong": h_wrong + m_wrong,
                     "shadow_hit_checks": h_n, "shadow_near_miss_checks": m_n, "shadow_false_hit_rate": rate,
                     "shadow_false_hit_upper": upper, "shadow_supported": bool(supported)})
    return pd.DataFrame(rows, columns=COLUMNS)
