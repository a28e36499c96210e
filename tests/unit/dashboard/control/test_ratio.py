"""dashboard.control.ratio: per-user ratio metrics with delta-method variances (golden values,
gbstats style), and the clustered-user A/A failure it fixes."""
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
from scipy import stats as sps

from dashboard.control.ratio import (FOURTH_MOMENTS, RatioStat, bayes_compare_ratios, diff_of_ratios,
                                     ratio_interval, sequential_path_ratios, sequential_test_ratios, welch_df)
from dashboard.control.stats import ProportionStat, diff_of_proportions, srm_check

DECIMALS = 5
round_ = partial(np.round, decimals=DECIMALS)

CONTROL = RatioStat.from_units([3, 1, 2, 5, 1, 4], [1, 0, 1, 2, 0, 2])
TREATMENT = RatioStat.from_units([2, 2, 6, 1, 3, 1], [2, 1, 4, 1, 2, 0])
# One user sends most of the requests and most of the hits: the variance rests on that user.
HEAVY = RatioStat.from_units([1, 1, 2, 1, 1, 3, 1, 1, 2, 40], [0, 0, 1, 0, 0, 0, 1, 0, 0, 30])


def _normal(stat: RatioStat) -> RatioStat:
    """The same sums without the fourth moments: the normal reading."""
    return replace(stat, fourth=None)


def test_sums_and_rate():
    s = RatioStat.from_units([1, 2, 3, 4, 10], [0, 1, 1, 3, 4])
    assert s == RatioStat(5, 20.0, 9.0, 130.0, 27.0, 57.0, (10354.0, 4227.0, 1757.0, 753.0, 339.0))
    assert s.rate == 0.45
    assert RatioStat.from_units([1, 2], [1, 0], fourth=False).fourth is None
    row = {"units": 5, "sum_x": 20, "sum_y": 9, "sum_x2": 130, "sum_y2": 27, "sum_xy": 57}
    assert RatioStat.from_sums(row) == _normal(s)
    assert RatioStat.from_sums({**row, **dict(zip(FOURTH_MOMENTS, s.fourth))}) == s
    with pytest.raises(ValueError):
        RatioStat(5, 20.0, 9.0, 130.0, 27.0, 57.0, (1.0, 2.0))


def test_delta_variance_equals_the_linearised_form():
    """Var(R) = var(y - R x) / (n mx^2): the delta method written the other way round."""
    x, y = np.array([1, 2, 3, 4, 10.0]), np.array([0, 1, 1, 3, 4.0])
    r = y.sum() / x.sum()
    s = RatioStat.from_units(x, y)
    assert s.rate_variance == pytest.approx(np.var(y - r * x, ddof=1) / x.mean() ** 2 / len(x), rel=1e-12)
    assert round_(s.rate_variance) == round_(0.00632812)
    assert round_(s.design_effect) == round_(0.51136)


def test_one_request_per_user_is_bernoulli():
    s = RatioStat.from_units([1] * 100, [1] * 30 + [0] * 70)
    assert s.rate_variance == pytest.approx(0.3 * 0.7 / 99, rel=1e-12)
    assert s.design_effect == pytest.approx(100 / 99)


def test_add_merges_disjoint_users():
    a, b = RatioStat.from_units([1, 2], [1, 0]), RatioStat.from_units([3], [2])
    assert a + b == RatioStat.from_units([1, 2, 3], [1, 0, 2])
    assert (a + _normal(b)).fourth is None


def test_variance_df_is_the_chi_square_match_of_the_residuals():
    """df = 2 (n - 1) m2^2 / (m4 - m2^2) over d = (y - R x) / mx, from the expanded sums; a
    heavy user leaves ~3 df of 10 users; near-normal residuals hit the cap n - 1."""
    x, y = np.array([1, 1, 2, 1, 1, 3, 1, 1, 2, 40.0]), np.array([0, 0, 1, 0, 0, 0, 1, 0, 0, 30.0])
    d = y - y.sum() / x.sum() * x
    m2, m4 = np.mean(d ** 2), np.mean(d ** 4)
    assert HEAVY.variance_df == pytest.approx(2 * 9 * m2 ** 2 / (m4 - m2 ** 2), rel=1e-9)
    assert round_(HEAVY.variance_df) == round_(2.97391)
    assert CONTROL.variance_df == 5.0 and TREATMENT.variance_df == 5.0  # capped at n - 1
    assert _normal(HEAVY).variance_df is None and RatioStat.from_units([4], [1]).variance_df is None
    assert RatioStat.from_units([2, 2], [2, 0]).variance_df == float("inf")  # |d| equal: m4 = m2^2
    assert round_(welch_df(CONTROL, HEAVY)) == round_(4.06719)
    assert round_(welch_df(CONTROL, TREATMENT)) == round_(8.97282)
    assert welch_df(CONTROL, _normal(TREATMENT)) is None


def test_diff_of_ratios_golden():
    r = diff_of_ratios(_normal(CONTROL), _normal(TREATMENT))
    assert (r.status, r.detail) == ("ok", "normal")
    assert round_([r.control_rate, r.treatment_rate, r.diff]).tolist() == round_([0.375, 2 / 3, 0.29167]).tolist()
    assert round_([r.ci_low, r.ci_high, r.p_value, r.z]).tolist() == \
        round_([0.10723, 0.47611, 0.00194, 3.09940]).tolist()


def test_diff_of_ratios_welch_t_golden():
    """With the fourth moments: the same statistic, read on Student's t at the Welch df."""
    r = diff_of_ratios(CONTROL, TREATMENT)
    assert (r.status, r.detail) == ("ok", "Welch t, 9.0 df")
    assert r.p_value == pytest.approx(2 * sps.t.sf(r.z, welch_df(CONTROL, TREATMENT)), rel=1e-12)
    assert round_([r.ci_low, r.ci_high, r.p_value, r.z]).tolist() == \
        round_([0.07869, 0.50464, 0.01278, 3.09940]).tolist()
    heavy = diff_of_ratios(CONTROL, HEAVY)
    assert heavy.detail == "Welch t, 4.1 df"
    assert round_([heavy.diff, heavy.ci_low, heavy.ci_high, heavy.p_value]).tolist() == \
        round_([0.22877, -0.15282, 0.61037, 0.17234]).tolist()


def test_interval_golden_and_statuses():
    ci = ratio_interval(_normal(CONTROL))
    assert (ci.status, round_(ci.low), round_(ci.high)) == ("ok", round_(0.26891), round_(0.48109))
    t5 = ratio_interval(CONTROL)  # Student's t, 5 df
    assert (t5.status, round_(t5.low), round_(t5.high)) == ("ok", round_(0.23586), round_(0.51414))
    assert ratio_interval(RatioStat(0, 0, 0, 0, 0, 0)).status == "no_data"
    one = ratio_interval(RatioStat.from_units([4], [1]))
    assert (one.status, one.rate, one.low) == ("no_data", 0.25, None)  # one user: no variance, no fake interval
    same = ratio_interval(RatioStat.from_units([2, 2], [1, 1]))
    assert same.status == "zero_variance" and same.low is None


def test_bayes_normal_posterior_golden():
    b = bayes_compare_ratios(CONTROL, TREATMENT)
    d = TREATMENT.rate - CONTROL.rate
    s = np.sqrt(CONTROL.rate_variance + TREATMENT.rate_variance)
    assert b.prob_treatment_better == pytest.approx(sps.norm.cdf(d / s), rel=1e-12)
    assert round_([b.prob_treatment_better, b.expected_loss_treatment, b.expected_loss_control]).tolist() == \
        round_([0.99903, 0.00003, 0.29169]).tolist()
    # E[max(T - C, 0)] - E[max(C - T, 0)] = E[T - C]
    assert b.expected_loss_control - b.expected_loss_treatment == pytest.approx(d, rel=1e-9)


def test_sequential_golden_and_running_minimum():
    r = sequential_test_ratios(CONTROL, TREATMENT)
    assert round_([r.likelihood_ratio, r.p_value, r.ci_low, r.ci_high]).tolist() == \
        round_([2.54239, 0.39333, -0.20934, 0.79267]).tolist()
    path = sequential_path_ratios([CONTROL, CONTROL], [TREATMENT, CONTROL])
    assert path.p_value == pytest.approx(r.p_value)  # the second look's A = A does not raise it
    with pytest.raises(ValueError):
        sequential_path_ratios([CONTROL], [])


def _clustered_arm(rng, users: int, icc: float, base: float = 0.3):
    """Heavy-tailed requests per user (lognormal, mean ~10) and a per-user hit propensity
    Beta-distributed with intra-user correlation ``icc``."""
    requests = np.maximum(1, rng.lognormal(1.8, 1.0, users).astype(int))
    k = (1 - icc) / icc
    propensity = rng.beta(base * k, (1 - base) * k, users)
    return requests, rng.binomial(requests, propensity)


def test_clustered_users_aa_per_user_keeps_its_level_per_request_does_not():
    """The audit's failure, pinned: A/A with users as the randomised unit (ICC 0.2). The
    per-request z-test fires far above 5%; the per-user (delta) z-test stays near it, and
    the SRM check on users does not alarm where the one on requests does."""
    rng = np.random.default_rng(26)
    sims, alpha = 300, 0.05
    per_request = per_user = srm_requests = srm_users = 0
    for _ in range(sims):
        users_a = int(rng.binomial(4000, 0.5))  # 4000 users, each assigned by a fair coin
        (xa, ya), (xb, yb) = _clustered_arm(rng, users_a, 0.2), _clustered_arm(rng, 4000 - users_a, 0.2)
        pa, pb = ProportionStat(int(xa.sum()), int(ya.sum())), ProportionStat(int(xb.sum()), int(yb.sum()))
        per_request += diff_of_proportions(pa, pb).p_value < alpha
        per_user += diff_of_ratios(RatioStat.from_units(xa, ya), RatioStat.from_units(xb, yb)).p_value < alpha
        srm_requests += srm_check({"a": pa.n, "b": pb.n}, {"a": 1, "b": 1}).mismatch
        srm_users += srm_check({"a": len(xa), "b": len(xb)}, {"a": 1, "b": 1}).mismatch
    assert per_request / sims > 0.3
    assert per_user / sims <= 0.08
    assert srm_requests / sims > 0.3 and srm_users <= 2  # alpha 0.001
