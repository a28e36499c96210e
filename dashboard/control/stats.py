"""A/B statistics on per-arm sufficient statistics.

Everything here works on what a ClickHouse ``GROUP BY arm`` returns (a count and
a number of successes), never on raw rows, so windows and partial aggregates
merge with ``+``. A statistic that cannot be computed (no data, zero variance)
says so in ``status``; it never returns a made-up p-value or interval.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as sps

Status = Literal["ok", "no_data", "zero_variance", "invalid"]
# Three views of the same ProportionStat inputs: the fixed-horizon z-test, a
# Beta-Binomial posterior, and an always-valid mSPRT that survives continuous peeking.
StatsEngine = Literal["frequentist", "bayesian", "sequential"]

DEFAULT_ALPHA = 0.05
SRM_ALPHA = 0.001
"""SRM is checked on every refresh, so it uses a strict level to keep false alarms rare."""


@dataclass(frozen=True)
class ProportionStat:
    """``successes`` out of ``n`` trials for one arm (e.g. hits out of requests)."""

    n: int
    successes: int

    def __post_init__(self) -> None:
        if self.n < 0 or self.successes < 0 or self.successes > self.n:
            raise ValueError(f"need 0 <= successes <= n, got n={self.n}, successes={self.successes}")

    def __add__(self, other: "ProportionStat") -> "ProportionStat":
        return ProportionStat(self.n + other.n, self.successes + other.successes)

    @property
    def rate(self) -> float | None:
        return self.successes / self.n if self.n else None

    @property
    def variance(self) -> float | None:
        """Bernoulli variance p(1-p) of one trial."""
        p = self.rate
        return None if p is None else p * (1.0 - p)


@dataclass(frozen=True)
class RateInterval:
    """A single rate with its confidence interval."""

    rate: float | None
    low: float | None
    high: float | None
    status: Status
    detail: str = ""


@dataclass(frozen=True)
class DiffResult:
    """Treatment minus control rate, with a two-sided test of equality."""

    control_rate: float | None
    treatment_rate: float | None
    diff: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    z: float | None
    status: Status
    detail: str = ""

    @property
    def relative_lift(self) -> float | None:
        if self.diff is None or not self.control_rate:
            return None
        return self.diff / self.control_rate


@dataclass(frozen=True)
class SrmResult:
    """Sample-ratio-mismatch check: do arm sizes match the configured weights?"""

    chi2: float | None
    p_value: float | None
    dof: int
    expected: dict[str, float]
    observed: dict[str, int]
    mismatch: bool
    status: Status
    detail: str = ""


@functools.lru_cache(maxsize=64)
def _z_critical(alpha: float) -> float:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return float(sps.norm.ppf(1.0 - alpha / 2.0))


def wilson_interval(stat: ProportionStat, alpha: float = DEFAULT_ALPHA) -> RateInterval:
    """Wilson score interval: stays inside [0, 1] and behaves at rates near 0 or 1."""
    z = _z_critical(alpha)
    if stat.n == 0:
        return RateInterval(None, None, None, "no_data", "no trials")
    p, n = stat.successes / stat.n, stat.n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return RateInterval(p, max(0.0, centre - half), min(1.0, centre + half), "ok")


def diff_of_proportions(control: ProportionStat, treatment: ProportionStat,
                        alpha: float = DEFAULT_ALPHA) -> DiffResult:
    """Two-sample test of ``treatment.rate - control.rate``.

    The interval uses the unpooled (Wald) standard error; the p-value uses the
    pooled standard error of the z-test under the null of equal rates.
    """
    z_crit = _z_critical(alpha)
    pc, pt = control.rate, treatment.rate
    if pc is None or pt is None:
        return DiffResult(pc, pt, None, None, None, None, None, "no_data",
                          "an arm has no trials")
    diff = pt - pc
    pooled = (control.successes + treatment.successes) / (control.n + treatment.n)
    se_pooled = math.sqrt(pooled * (1 - pooled) * (1 / control.n + 1 / treatment.n))
    se_unpooled = math.sqrt(pc * (1 - pc) / control.n + pt * (1 - pt) / treatment.n)
    if se_pooled == 0.0:
        return DiffResult(pc, pt, diff, None, None, None, None, "zero_variance",
                          "every trial in both arms had the same outcome")
    z = diff / se_pooled
    p_value = float(2.0 * sps.norm.sf(abs(z)))
    if se_unpooled == 0.0:
        # e.g. 0/10 vs 10/10: the test is defined, the Wald interval is not.
        return DiffResult(pc, pt, diff, None, None, p_value, z, "zero_variance",
                          "no within-arm variance: interval undefined")
    half = z_crit * se_unpooled
    return DiffResult(pc, pt, diff, diff - half, diff + half, p_value, z, "ok")


def srm_check(observed: Mapping[str, int], weights: Mapping[str, float],
              alpha: float = SRM_ALPHA) -> SrmResult:
    """Chi-square goodness of fit of arm sizes against the configured arm weights.

    Arms present in ``weights`` but absent from ``observed`` count as 0; an
    observed arm without a weight makes the check ``invalid``.
    """
    counts = {arm: int(observed.get(arm, 0)) for arm in weights}
    unknown = sorted(set(observed) - set(weights))
    if unknown:
        return SrmResult(None, None, 0, {}, dict(observed), False, "invalid",
                         f"arms without a configured weight: {unknown}")
    total_weight = sum(weights.values())
    if len(weights) < 2 or total_weight <= 0:
        return SrmResult(None, None, 0, {}, counts, False, "invalid",
                         "need at least two arms with positive weights")
    total = sum(counts.values())
    if total == 0:
        return SrmResult(None, None, len(weights) - 1, {}, counts, False, "no_data", "no trials")
    expected = {arm: total * w / total_weight for arm, w in weights.items()}
    chi2 = sum((counts[a] - expected[a]) ** 2 / expected[a] for a in weights)
    dof = len(weights) - 1
    p_value = float(sps.chi2.sf(chi2, dof))
    return SrmResult(chi2, p_value, dof, expected, counts, p_value < alpha, "ok")



# -- Bayesian: Beta-Binomial posteriors ----------------------------------------------

DEFAULT_PRIOR = (1.0, 1.0)
"""Beta(1, 1): uniform on the rate."""
_QUADRATURE_POINTS = 4000


@dataclass(frozen=True)
class BayesResult:
    """Posterior comparison of treatment vs control rates (Beta-Binomial, independent arms)."""

    prob_treatment_better: float | None
    """P(p_treatment > p_control | data)."""
    expected_loss_treatment: float | None
    """E[max(p_control - p_treatment, 0)]: what choosing treatment costs if it is worse."""
    expected_loss_control: float | None
    """E[max(p_treatment - p_control, 0)]."""
    status: Status
    detail: str = ""


def _posterior(stat: ProportionStat, prior: tuple[float, float]) -> tuple[float, float]:
    a0, b0 = prior
    if a0 <= 0 or b0 <= 0:
        raise ValueError(f"Beta prior parameters must be positive, got {prior}")
    return a0 + stat.successes, b0 + stat.n - stat.successes


def _expected_excess(a: float, b: float, x: np.ndarray) -> np.ndarray:
    """E[max(P - x, 0)] for P ~ Beta(a, b): E[P; P > x] - x P(P > x), in closed form."""
    return a / (a + b) * sps.beta.sf(x, a + 1, b) - x * sps.beta.sf(x, a, b)


def bayes_compare(control: ProportionStat, treatment: ProportionStat,
                  prior: tuple[float, float] = DEFAULT_PRIOR) -> BayesResult:
    """Chance to beat control and expected losses under independent Beta posteriors.

    Both quantities are one-dimensional integrals over the treatment posterior,
    computed by the midpoint rule in its quantile space (smooth, bounded integrands).
    """
    if control.n == 0 or treatment.n == 0:
        return BayesResult(None, None, None, "no_data", "an arm has no trials")
    ac, bc = _posterior(control, prior)
    at, bt = _posterior(treatment, prior)
    u = (np.arange(_QUADRATURE_POINTS) + 0.5) / _QUADRATURE_POINTS
    x = sps.beta.ppf(u, at, bt)  # draws of p_treatment, evenly in probability
    prob = float(np.mean(sps.beta.cdf(x, ac, bc)))
    loss_t = float(np.mean(_expected_excess(ac, bc, x)))
    # E[max(pt - pc, 0)] = E[pt - pc] + E[max(pc - pt, 0)]
    loss_c = float(at / (at + bt) - ac / (ac + bc) + loss_t)
    return BayesResult(prob, loss_t, max(loss_c, 0.0), "ok")


# -- Sequential: mixture SPRT, always-valid p-values -------------------------------

DEFAULT_MIXTURE_SD = 0.05
"""Scale of the normal mixture over the effect (a 5-point hit-rate difference)."""


@dataclass(frozen=True)
class SequentialResult:
    """mSPRT of treatment - control: valid however often it is looked at."""

    diff: float | None
    likelihood_ratio: float | None
    p_value: float | None
    """Always-valid p-value at this look (the running minimum when a path is given)."""
    ci_low: float | None
    ci_high: float | None
    """Always-valid confidence sequence at this look."""
    reject: bool
    status: Status
    detail: str = ""


def msprt_statistic(estimate: float, variance: float, mixture_sd: float = DEFAULT_MIXTURE_SD,
                    null: float = 0.0) -> float:
    """Mixture likelihood ratio of a normal estimate against ``null`` (Johari et al. 2017).

    With theta_hat ~ N(theta, V) and theta ~ N(null, tau^2) under the alternative:
    Lambda = sqrt(V / (V + tau^2)) * exp(tau^2 (theta_hat - null)^2 / (2 V (V + tau^2))).
    """
    if variance <= 0 or mixture_sd <= 0:
        raise ValueError(f"variance and mixture_sd must be positive, got {variance}, {mixture_sd}")
    tau2 = mixture_sd * mixture_sd
    log_lr = 0.5 * math.log(variance / (variance + tau2)) + \
        tau2 * (estimate - null) ** 2 / (2 * variance * (variance + tau2))
    return math.exp(min(log_lr, 700.0))


def confidence_sequence_halfwidth(variance: float, alpha: float = DEFAULT_ALPHA,
                                  mixture_sd: float = DEFAULT_MIXTURE_SD) -> float:
    """Half-width of the always-valid interval: the nulls the mSPRT does not reject at ``alpha``."""
    tau2 = mixture_sd * mixture_sd
    return math.sqrt(2 * variance * (variance + tau2) / tau2 *
                     (math.log(1 / alpha) + 0.5 * math.log((variance + tau2) / variance)))


def sequential_test(control: ProportionStat, treatment: ProportionStat,
                    alpha: float = DEFAULT_ALPHA, mixture_sd: float = DEFAULT_MIXTURE_SD,
                    previous_p: float = 1.0) -> SequentialResult:
    """One look of the mSPRT on two proportions (pooled variance under the null).

    ``previous_p`` is the always-valid p-value of the previous look; the p-value
    reported is never larger (p_n = min(p_{n-1}, 1 / Lambda_n)).
    """
    _z_critical(alpha)
    pc, pt = control.rate, treatment.rate
    if pc is None or pt is None:
        return SequentialResult(None, None, previous_p, None, None, False, "no_data", "an arm has no trials")
    pooled = (control.successes + treatment.successes) / (control.n + treatment.n)
    variance = pooled * (1 - pooled) * (1 / control.n + 1 / treatment.n)
    if variance == 0.0:
        return SequentialResult(pt - pc, None, previous_p, None, None, previous_p <= alpha,
                                "zero_variance", "every trial in both arms had the same outcome")
    diff = pt - pc
    lr = msprt_statistic(diff, variance, mixture_sd)
    p_value = min(previous_p, 1.0 / lr, 1.0)
    half = confidence_sequence_halfwidth(variance, alpha, mixture_sd)
    return SequentialResult(diff, lr, p_value, diff - half, diff + half, p_value <= alpha, "ok")


def sequential_path(control_path: Sequence[ProportionStat], treatment_path: Sequence[ProportionStat],
                    alpha: float = DEFAULT_ALPHA,
                    mixture_sd: float = DEFAULT_MIXTURE_SD) -> SequentialResult:
    """The mSPRT after a sequence of looks at cumulative counts (e.g. one per time bucket)."""
    if len(control_path) != len(treatment_path):
        raise ValueError("control and treatment paths must have the same number of looks")
    result = SequentialResult(None, None, 1.0, None, None, False, "no_data", "no looks")
    p = 1.0
    for c, t in zip(control_path, treatment_path):
        result = sequential_test(c, t, alpha, mixture_sd, previous_p=p)
        p = result.p_value if result.p_value is not None else p
    return result


# -- one-sided bounds and multiple comparisons ---------------------------------------

def upper_bound(stat: ProportionStat, alpha: float = DEFAULT_ALPHA) -> float | None:
    """One-sided (1 - alpha) Clopper-Pearson upper bound of the rate (exact, conservative)."""
    if stat.n == 0:
        return None
    if stat.successes == stat.n:
        return 1.0
    return float(sps.beta.ppf(1 - alpha, stat.successes + 1, stat.n - stat.successes))


def lower_bound(stat: ProportionStat, alpha: float = DEFAULT_ALPHA) -> float | None:
    """One-sided (1 - alpha) Clopper-Pearson lower bound of the rate."""
    if stat.n == 0:
        return None
    if stat.successes == 0:
        return 0.0
    return float(sps.beta.ppf(alpha, stat.successes, stat.n - stat.successes + 1))


def holm_adjust(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values (step-down, monotone); None entries stay None."""
    indexed = [(p, i) for i, p in enumerate(p_values) if p is not None and p == p]
    m = len(indexed)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(indexed)):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted
