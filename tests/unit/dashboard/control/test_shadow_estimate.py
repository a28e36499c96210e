"""dashboard.control.shadow_estimate: the false-hit rate from shadow checks weighted by inclusion
probability per hour (issue 26, item 4), golden values and the bias it removes."""
import numpy as np
import pandas as pd
import pytest

from dashboard.control import shadow_estimate
from dashboard.control.shadow_estimate import estimates_frame, weighted_rate


def _strata(rows, arm="a"):
    return pd.DataFrame(rows, columns=["epoch_hour", "hits", "checked", "wrong"]).assign(arm=arm)


def test_golden_values():
    # A busy hour (900 hits, 30 checked: the budget ran out) at 10% wrong, a quiet one (100 hits,
    # all 100 checked) at 1%: unweighted 4 / 130 = 3.1%, weighted 0.9 * 10% + 0.1 * 1% = 9.1%.
    w = weighted_rate(_strata([(1, 900, 30, 3), (2, 100, 100, 1)]))
    assert round(w.rate, 5) == 0.091 and w.checked == 130 and w.coverage == 1.0
    assert (round(w.low, 5), round(w.high, 5)) == (0.0, 0.18764)  # 0.091 -+ 1.96 * sqrt(0.81 * 0.09 / 30 + ...)
    some = weighted_rate(_strata([(1, 300, 0, 0), (2, 100, 50, 5)]))  # hour 1 unchecked: left out
    assert some.rate == pytest.approx(0.1) and some.coverage == pytest.approx(0.25)
    none = weighted_rate(_strata([(1, 300, 0, 0)]))
    assert none.rate is None and none.coverage == 0.0
    assert weighted_rate(_strata([])).rate is None


def test_the_weighting_removes_the_budget_bias():
    """Busy hours wrong more often and checked less (a fixed budget): the plain share wrong among
    checks is biased low; the weighted estimate is not (2,000 simulated days)."""
    rng = np.random.default_rng(26)
    hits = np.array([2000, 200] * 12)
    p = np.where(hits > 1000, 0.06, 0.01)
    truth = (hits * p).sum() / hits.sum()
    plain, weighted = [], []
    for _ in range(2000):
        checked = np.minimum(rng.binomial(hits, 0.25), 60)  # 25% drawn, at most 60 an hour
        wrong = rng.binomial(checked, p)
        plain.append(wrong.sum() / checked.sum())
        weighted.append(weighted_rate(_strata(list(zip(range(24), hits, checked, wrong)))).rate)
    assert np.mean(plain) < truth - 0.015  # 3.5% vs 5.5%
    assert abs(np.mean(weighted) - truth) < 0.001


def test_estimates_frame_says_what_each_number_rests_on():
    users = pd.DataFrame({"arm": ["a", "a", "b"], "correct": [90, 5, 10], "wrong": [4, 1, 0]})
    frame = estimates_frame(users, _strata([(1, 900, 30, 3), (2, 100, 100, 1)]))
    assert frame[["arm", "estimate"]].values.tolist() == [["a", "shadow, weighted"], ["a", "users"], ["b", "users"]]
    assert frame.loc[1, "false_hit_rate"] == pytest.approx(5 / 100) and frame.loc[1, "verdicts"] == 100
    assert frame.loc[0, "basis"] == shadow_estimate.BASIS_SHADOW and frame.loc[1, "basis"] == shadow_estimate.BASIS_USERS
    assert estimates_frame(None, None).empty
