"""The false-hit rate from solicited verdicts: users asked about a random sample of hits.

An arm with ``feedback_sample_rate`` p > 0 asks the user for a verdict on each hit with
probability p and logs it (``CacheEvent.feedback_requested`` / ``feedback_prob``;
docs/solicited_feedback.md). Those verdicts are a designed sample, unlike the self-selected
ones users give unasked, and are never pooled with them. Each weighs 1 / p: per user u,
x_u = the weighted requested hits with a verdict, y_u = the weighted wrong ones
(``sql_units.UNIT_SOLICITED_FALSE_HITS_SQL``); the rate sum y / sum x is the Hajek estimator
and its interval the delta method over users (``ratio.ratio_interval``), since a user's
verdicts share that user's propensity like any other per-user ratio.

A requested hit the user never answers is self-selection again. So each arm also shows its
response rate (weighted answered / requested) and the worst case that counts every unanswered
request as wrong, (wrong + unanswered) / requested, weighted: the estimate holds only if
answering does not depend on the answer being right, the worst case holds regardless.
"""
from __future__ import annotations

import pandas as pd

from dashboard.control.ratio import RatioStat, ratio_interval
from dashboard.control.stats import DEFAULT_ALPHA

BASIS_SOLICITED = ("users' verdicts on hits the service asked about at random, weighted by 1 / the logged "
                   "probability (assumes answering does not depend on the answer being right)")
COLUMNS = ["arm", "estimate", "false_hit_rate", "low", "high", "verdicts", "coverage", "if_unanswered_wrong",
           "basis"]


def estimates_frame(units: pd.DataFrame | None, response: pd.DataFrame | None,
                    alpha: float = DEFAULT_ALPHA) -> pd.DataFrame:
    """Per arm with solicited verdicts: the weighted rate and its interval, the verdicts behind it,
    the weighted response rate (``coverage``) and the worst case; from ``queries.unit_solicited_false_hits``
    and ``queries.solicited_response``. Empty when no arm asked."""
    rows = []
    answered = {} if response is None or response.empty else response.set_index("arm").to_dict("index")
    for row in ([] if units is None or units.empty else units.to_dict("records")):
        stat = RatioStat.from_sums(row)
        if stat.rate is None:
            continue
        ci = ratio_interval(stat, alpha)
        r = answered.get(row["arm"], {})
        asked, got = float(r.get("requested_weight", 0.0)), float(r.get("answered_weight", 0.0))
        rows.append({"arm": row["arm"], "estimate": "users asked at random, weighted", "false_hit_rate": stat.rate,
                     "low": ci.low, "high": ci.high, "verdicts": int(r.get("answered", 0)),
                     "coverage": got / asked if asked else None,
                     "if_unanswered_wrong": (float(r.get("wrong_weight", 0.0)) + asked - got) / asked if asked else None,
                     "basis": BASIS_SOLICITED})
    return pd.DataFrame(rows, columns=COLUMNS)
