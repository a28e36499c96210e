"""dashboard.control.solicited: the false-hit rate from verdicts asked for on a random sample of hits,
weighted by 1 / the logged probability, with its response rate and worst case (golden values)."""
from functools import partial

import numpy as np
import pandas as pd

from dashboard.control.ratio import FOURTH_MOMENTS, RatioStat, ratio_interval
from dashboard.control.solicited import BASIS_SOLICITED, estimates_frame

round_ = partial(np.round, decimals=5)


def _units(arm: str, x, y) -> dict:
    s = RatioStat.from_units(x, y)
    return {"arm": arm, "units": s.n, "sum_x": s.sum_x, "sum_y": s.sum_y, "sum_x2": s.sum_x2, "sum_y2": s.sum_y2,
            "sum_xy": s.sum_xy, **dict(zip(FOURTH_MOMENTS, s.fourth))}


# six users of arm a, each verdict weighing 2 (asked at p = 0.5) or 4 (p = 0.25): per user the weighted
# answered hits (x) and weighted wrong ones (y); 10 requests (weight 28), 8 answered (weight 24)
X, Y = [4, 4, 2, 2, 4, 8], [2, 0, 0, 2, 4, 0]
UNITS = pd.DataFrame([_units("a", X, Y)])
RESPONSE = pd.DataFrame([{"arm": "a", "requested": 10, "answered": 8, "requested_weight": 28.0,
                          "answered_weight": 24.0, "wrong_weight": 8.0}])


def test_weighted_rate_interval_response_and_worst_case_golden():
    (row,) = estimates_frame(UNITS, RESPONSE).to_dict("records")
    assert row["arm"] == "a" and row["basis"] == BASIS_SOLICITED and row["verdicts"] == 8
    assert round_(row["false_hit_rate"]) == round_(8 / 24)
    ci = ratio_interval(RatioStat.from_units(X, Y))  # per user, Student's t at 5 df
    assert (row["low"], row["high"]) == (ci.low, ci.high)
    assert round_([row["low"], row["high"]]).tolist() == round_([0.0, 0.84026]).tolist()
    assert round_(row["coverage"]) == round_(24 / 28)
    assert round_(row["if_unanswered_wrong"]) == round_((8 + 4) / 28)


def test_no_asking_arm_means_no_rows():
    assert estimates_frame(None, None).empty
    assert estimates_frame(pd.DataFrame(columns=UNITS.columns), None).empty
    (row,) = estimates_frame(UNITS, None).to_dict("records")  # no response counts: rate without coverage
    assert row["coverage"] is None and row["if_unanswered_wrong"] is None
