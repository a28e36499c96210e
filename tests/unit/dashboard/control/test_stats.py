"""dashboard.control.stats against scipy/statsmodels on fixed inputs."""
from functools import partial

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.proportion import (
    confint_proportions_2indep,
    proportion_confint,
    proportions_ztest,
)

from dashboard.control.stats import (
    ProportionStat,
    diff_of_proportions,
    srm_check,
    wilson_interval,
)

DECIMALS = 6
round_ = partial(np.round, decimals=DECIMALS)

CONTROL = ProportionStat(n=1000, successes=611)
TREATMENT = ProportionStat(n=1040, successes=752)


def test_add_keeps_type_and_sums():
    total = ProportionStat(10, 3) + ProportionStat(5, 5)
    assert type(total) is ProportionStat
    assert (total.n, total.successes) == (15, 8)


def test_rejects_impossible_counts():
    with pytest.raises(ValueError, match="successes <= n"):
        ProportionStat(3, 4)


@pytest.mark.parametrize("n,k", [(1000, 611), (20, 0), (20, 20), (7, 3)])
def test_wilson_matches_statsmodels(n, k):
    got = wilson_interval(ProportionStat(n, k))
    low, high = proportion_confint(k, n, alpha=0.05, method="wilson")
    assert got.status == "ok"
    assert round_(got.low) == round_(low)
    assert round_(got.high) == round_(high)


def test_wilson_no_data_has_no_interval():
    got = wilson_interval(ProportionStat(0, 0))
    assert got.status == "no_data"
    assert got.low is None and got.high is None and got.rate is None


def test_diff_pvalue_matches_pooled_ztest():
    got = diff_of_proportions(CONTROL, TREATMENT)
    z, p = proportions_ztest([TREATMENT.successes, CONTROL.successes], [TREATMENT.n, CONTROL.n])
    assert got.status == "ok"
    assert round_(got.z) == round_(z)
    assert round_(got.p_value) == round_(p)
    assert round_(got.diff) == round_(752 / 1040 - 611 / 1000)


def test_diff_ci_matches_wald_2indep():
    got = diff_of_proportions(CONTROL, TREATMENT)
    low, high = confint_proportions_2indep(
        TREATMENT.successes, TREATMENT.n, CONTROL.successes, CONTROL.n,
        method="wald", compare="diff", alpha=0.05)
    assert round_(got.ci_low) == round_(low)
    assert round_(got.ci_high) == round_(high)
    assert got.ci_low < got.diff < got.ci_high


def test_diff_alpha_widens_interval():
    narrow = diff_of_proportions(CONTROL, TREATMENT, alpha=0.10)
    wide = diff_of_proportions(CONTROL, TREATMENT, alpha=0.01)
    assert wide.ci_high - wide.ci_low > narrow.ci_high - narrow.ci_low


def test_diff_no_data_is_explicit():
    got = diff_of_proportions(ProportionStat(0, 0), TREATMENT)
    assert got.status == "no_data"
    assert got.p_value is None and got.diff is None


def test_diff_zero_variance_never_fakes_a_pvalue():
    got = diff_of_proportions(ProportionStat(50, 50), ProportionStat(80, 80))
    assert got.status == "zero_variance"
    assert got.p_value is None and got.ci_low is None
    assert got.diff == 0.0


def test_diff_separated_arms_keep_test_but_no_interval():
    got = diff_of_proportions(ProportionStat(10, 0), ProportionStat(10, 10))
    _, p = proportions_ztest([10, 0], [10, 10])
    assert got.status == "zero_variance"
    assert got.ci_low is None
    assert round_(got.p_value) == round_(p)


def test_relative_lift():
    got = diff_of_proportions(ProportionStat(100, 50), ProportionStat(100, 60))
    assert got.relative_lift == pytest.approx(0.2)


def test_srm_matches_scipy_chisquare():
    observed = {"control": 5210, "treatment": 4790}
    got = srm_check(observed, {"control": 1, "treatment": 1})
    ref = sps.chisquare([5210, 4790], f_exp=[5000, 5000])
    assert got.status == "ok"
    assert round_(got.chi2) == round_(ref.statistic)
    assert round_(got.p_value) == round_(ref.pvalue)
    assert got.mismatch  # p ~ 2.7e-5 < 0.001


def test_srm_unequal_weights_balanced_sample_is_fine():
    got = srm_check({"a": 2010, "b": 990, "c": 1000}, {"a": 2, "b": 1, "c": 1})
    ref = sps.chisquare([2010, 990, 1000], f_exp=[2000, 1000, 1000])
    assert round_(got.p_value) == round_(ref.pvalue)
    assert got.dof == 2
    assert not got.mismatch


def test_srm_missing_arm_counts_as_zero():
    got = srm_check({"a": 100}, {"a": 1, "b": 1})
    assert got.observed == {"a": 100, "b": 0}
    assert got.mismatch


def test_srm_unknown_arm_is_invalid():
    got = srm_check({"a": 10, "zzz": 3}, {"a": 1, "b": 1})
    assert got.status == "invalid" and got.p_value is None
    assert "zzz" in got.detail


def test_srm_no_data():
    got = srm_check({}, {"a": 1, "b": 1})
    assert got.status == "no_data" and got.p_value is None and not got.mismatch

