"""Bayesian, sequential, one-sided bounds and Holm in dashboard.control.stats, against scipy/statsmodels."""
import math
import time

import numpy as np
import pytest
from scipy import stats as sps
from scipy.special import betaln
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from dashboard.control import stats
from dashboard.control.simulation import aa_simulation
from dashboard.control.stats import ProportionStat

CONTROL = ProportionStat(n=1000, successes=611)
TREATMENT = ProportionStat(n=1040, successes=652)


def _prob_b_beats_a_closed_form(a_a, b_a, a_b, b_b):
    """Evan Miller's exact sum for integer a_b."""
    i = np.arange(int(a_b))
    terms = betaln(a_a + i, b_a + b_b) - np.log(b_b + i) - betaln(1 + i, b_b) - betaln(a_a, b_a)
    return float(np.exp(terms).sum())


@pytest.mark.parametrize("control,treatment", [
    (CONTROL, TREATMENT), (ProportionStat(50, 10), ProportionStat(40, 15)), (ProportionStat(30, 0), ProportionStat(30, 1)),
])
def test_probability_to_beat_matches_exact_sum(control, treatment):
    got = stats.bayes_compare(control, treatment)
    exact = _prob_b_beats_a_closed_form(control.successes + 1, control.n - control.successes + 1,
                                        treatment.successes + 1, treatment.n - treatment.successes + 1)
    assert got.status == "ok"
    assert got.prob_treatment_better == pytest.approx(exact, abs=1e-4)


def test_expected_loss_matches_monte_carlo():
    control, treatment = ProportionStat(50, 10), ProportionStat(40, 15)
    ac, bc, at, bt = 11, 41, 16, 26
    rng = np.random.default_rng(3)
    pc, pt = sps.beta.rvs(ac, bc, size=2_000_000, random_state=rng), sps.beta.rvs(at, bt, size=2_000_000, random_state=rng)
    got = stats.bayes_compare(control, treatment)
    assert got.expected_loss_treatment == pytest.approx(np.maximum(pc - pt, 0).mean(), abs=1e-4)
    assert got.prob_treatment_better == pytest.approx((pt > pc).mean(), abs=2e-3)
    # E[max(pt - pc, 0)] - E[max(pc - pt, 0)] = E[pt] - E[pc]
    assert got.expected_loss_control - got.expected_loss_treatment == pytest.approx(at / (at + bt) - ac / (ac + bc))


def test_bayes_no_data_and_bad_prior():
    assert stats.bayes_compare(ProportionStat(0, 0), CONTROL).status == "no_data"
    with pytest.raises(ValueError, match="positive"):
        stats.bayes_compare(CONTROL, TREATMENT, prior=(0, 1))


def test_msprt_statistic_is_ratio_of_marginal_densities():
    estimate, variance, tau = 0.03, 0.0004, 0.05
    expected = sps.norm.pdf(estimate, 0, math.sqrt(variance + tau ** 2)) / sps.norm.pdf(estimate, 0, math.sqrt(variance))
    assert stats.msprt_statistic(estimate, variance, tau) == pytest.approx(expected, rel=1e-9)


def test_confidence_sequence_edge_is_where_the_test_rejects():
    variance, alpha = 0.0004, 0.05
    half = stats.confidence_sequence_halfwidth(variance, alpha)
    assert stats.msprt_statistic(half, variance) == pytest.approx(1 / alpha, rel=1e-9)
    assert half > sps.norm.ppf(0.975) * math.sqrt(variance)  # wider than the fixed-horizon CI


def test_sequential_p_value_never_increases_along_a_path():
    path_c = [ProportionStat(100 * k, 40 * k) for k in range(1, 6)]
    path_t = [ProportionStat(100 * k, 40 * k + (50 if k == 2 else 0)) for k in range(1, 6)]
    best = stats.sequential_test(path_c[1], path_t[1]).p_value
    final = stats.sequential_path(path_c, path_t)
    assert best < 0.05
    assert final.p_value == pytest.approx(best)  # the evidence at look 2 is not forgotten
    assert final.p_value < stats.sequential_test(path_c[-1], path_t[-1]).p_value


def test_sequential_detects_a_real_difference_and_is_stricter_than_fixed():
    strong = stats.sequential_test(ProportionStat(5000, 2000), ProportionStat(5000, 2300))
    assert strong.reject and strong.ci_low > 0
    z_only = stats.diff_of_proportions(ProportionStat(1000, 400), ProportionStat(1000, 445))
    seq = stats.sequential_test(ProportionStat(1000, 400), ProportionStat(1000, 445))
    assert z_only.p_value < 0.05 and seq.p_value > z_only.p_value


@pytest.mark.parametrize("n,k", [(200, 7), (50, 0), (30, 30), (1000, 611)])
def test_one_sided_bounds_match_statsmodels_clopper_pearson(n, k):
    low, high = proportion_confint(k, n, alpha=0.10, method="beta")  # two-sided 90% = one-sided 95% each
    assert stats.upper_bound(ProportionStat(n, k), 0.05) == pytest.approx(high, abs=1e-9)
    assert stats.lower_bound(ProportionStat(n, k), 0.05) == pytest.approx(low, abs=1e-9)
    assert stats.upper_bound(ProportionStat(0, 0)) is None


def test_holm_matches_statsmodels():
    p = [0.01, 0.04, 0.03, 0.005, 0.5, 0.2]
    expected = multipletests(p, method="holm")[1]
    assert stats.holm_adjust(p) == pytest.approx(list(expected))
    assert stats.holm_adjust([0.02, None, 0.01]) == [pytest.approx(0.02), None, pytest.approx(0.02)]


def test_aa_simulation_sequential_keeps_its_level_under_peeking():
    started = time.monotonic()
    result = aa_simulation(simulations=400, looks=40, seed=11)
    elapsed = time.monotonic() - started
    # Binomial noise of 400 runs at 5%: sd ~1.1 pts; the mSPRT sits well under alpha.
    assert result.sequential_false_positive_rate <= 0.05
    assert result.naive_false_positive_rate > 0.15  # peeking at a z-test 40 times inflates it
    assert result.final_look_false_positive_rate < 0.09
    assert elapsed < 15
    print(f"A/A: naive {result.naive_false_positive_rate:.3f}, sequential "
          f"{result.sequential_false_positive_rate:.3f}, single look {result.final_look_false_positive_rate:.3f} "
          f"in {elapsed:.1f}s")
