"""Statistics at the unit of randomisation: ratio metrics per user, delta-method variances.

``assign()`` randomises users (``unit_id``), not requests. A user's requests share that
user's propensity to hit (and to be served a wrong answer), so requests are not
independent trials: treating them as Bernoulli draws understates every variance, and the
more requests a user sends, the worse. Here the unit is the user. A rate such as the hit
rate is a ratio of two per-user sums, R = sum_u y_u / sum_u x_u (x_u: the user's requests,
y_u: their hits; or x_u: their labelled hits, y_u: the wrong ones), the same number as the
pooled per-request rate. Its variance comes from the delta method over users (Deng, Knoblich
and Lu, "Applying the Delta Method in Metric Analytics", KDD 2018; GrowthBook's gbstats
``RatioStatistic`` does the same):

    Var(R) = (1 / n) * (var_y / mx^2 + var_x * my^2 / mx^4 - 2 cov_xy * my / mx^3)

with mx, my the per-user means and var / cov the sample (n - 1) moments. Everything works
on six sums per arm that ClickHouse returns over a per-user subquery (``sql_units.UNIT_STATS_SQL``):
n users, sum x, sum y, sum x^2, sum y^2, sum xy, so the dashboard never pulls raw events.
The tests here (z-test, interval, normal-posterior chance to beat, mSPRT and its confidence
sequence) mirror those of ``stats`` on ``ProportionStat``; a statistic that cannot be
computed says so in ``status``.

Small samples and heavy tails. The variance above is itself an estimate, and a noisy one when
a few users send most of the requests or the rate is small and clustered: with lognormal
requests per user, ICC 0.2 and a 1% rate, the per-user z-test's A/A type-I read ~5.4% at
nominal 5% (bench/stats_simulation.py), because the variance estimate of 10,000 users per arm
is as variable as that of ~50 normal draws. Five more sums per arm (x^4, x^3 y, x^2 y^2, x y^3,
y^4 over users) give the fourth moment of the linearised residuals d_u = (y_u - R x_u) / mx, so
the variance's own variance, and its effective degrees of freedom

    df = 2 (n - 1) m2^2 / (m4 - m2^2)        (m_k = mean of d_u^k; normal d: df = n - 1)

(the chi-square match of the sample variance, as Welch-Satterthwaite uses it). The fixed-horizon
test and the intervals then use Student's t at the Welch-Satterthwaite df of the two arms instead
of the normal. A ``RatioStat`` without them (None) keeps the normal reading.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from dashboard.control.stats import (DEFAULT_ALPHA, DEFAULT_MIXTURE_SD, BayesResult, DiffResult, RateInterval,
                                     SequentialResult, _z_critical, confidence_sequence_halfwidth,
                                     msprt_statistic)

MIN_UNITS = 2
"""Below this many users per arm no variance can be estimated."""

FOURTH_MOMENTS = ("sum_x4", "sum_x3y", "sum_x2y2", "sum_xy3", "sum_y4")
"""Names (and SQL columns, ``sql_units``) of ``RatioStat.fourth``, in order."""


@dataclass(frozen=True)
class RatioStat:
    """Per-user sufficient statistics of a ratio metric sum(y) / sum(x) over ``n`` users."""

    n: int
    """Users (units of randomisation) with at least one x."""
    sum_x: float
    sum_y: float
    sum_x2: float
    sum_y2: float
    sum_xy: float
    fourth: tuple[float, float, float, float, float] | None = None
    """Sums over users of x^4, x^3 y, x^2 y^2, x y^3, y^4 (``FOURTH_MOMENTS``), for the variance's
    degrees of freedom; None: not read (the tests then use the normal)."""

    def __post_init__(self) -> None:
        if self.n < 0 or min(self.sum_x, self.sum_y, self.sum_x2, self.sum_y2, self.sum_xy) < 0:
            raise ValueError(f"need n >= 0 and non-negative sums, got {self}")
        if self.n == 0 and self.sum_x:
            raise ValueError(f"sums without users: {self}")
        if self.fourth is not None and (len(self.fourth) != len(FOURTH_MOMENTS) or min(self.fourth) < 0):
            raise ValueError(f"need {len(FOURTH_MOMENTS)} non-negative fourth-moment sums, got {self.fourth}")

    def __add__(self, other: "RatioStat") -> "RatioStat":
        """Two aggregates over *disjoint* sets of users (e.g. two namespaces' users). Two time
        windows of the same users do not add: a user's x and y add before they are squared."""
        fourth = None if self.fourth is None or other.fourth is None else \
            tuple(a + b for a, b in zip(self.fourth, other.fourth))
        return RatioStat(self.n + other.n, self.sum_x + other.sum_x, self.sum_y + other.sum_y,
                         self.sum_x2 + other.sum_x2, self.sum_y2 + other.sum_y2, self.sum_xy + other.sum_xy, fourth)

    @classmethod
    def from_units(cls, x: Sequence[float], y: Sequence[float], fourth: bool = True) -> "RatioStat":
        """From per-user values (tests and simulations; the dashboard gets the sums from SQL).
        ``fourth=False`` leaves the fourth-moment sums out (the normal reading)."""
        x, y = np.asarray(x, dtype="float64"), np.asarray(y, dtype="float64")
        if x.shape != y.shape:
            raise ValueError(f"x and y must have the same length, got {x.shape} and {y.shape}")
        moments = tuple(float((x ** i * y ** (4 - i)).sum()) for i in (4, 3, 2, 1, 0)) if fourth else None
        return cls(int(x.size), float(x.sum()), float(y.sum()), float((x * x).sum()), float((y * y).sum()),
                   float((x * y).sum()), moments)

    @classmethod
    def from_sums(cls, row: Mapping[str, float]) -> "RatioStat":
        """From a row of ``sql_units`` (``units``, ``sum_x`` ... ``sum_xy`` and, when the query
        read them, the ``FOURTH_MOMENTS`` columns)."""
        fourth = tuple(float(row[c]) for c in FOURTH_MOMENTS) if all(c in row for c in FOURTH_MOMENTS) else None
        return cls(int(row["units"]), float(row["sum_x"]), float(row["sum_y"]), float(row["sum_x2"]),
                   float(row["sum_y2"]), float(row["sum_xy"]), fourth)

    @property
    def rate(self) -> float | None:
        """sum y / sum x: the pooled rate (hits per request, wrong per labelled hit)."""
        return self.sum_y / self.sum_x if self.sum_x else None

    @property
    def unit_variance(self) -> float | None:
        """Delta-method variance of the ratio, per user (``rate_variance`` times n)."""
        if self.n < MIN_UNITS or not self.sum_x:
            return None
        n = self.n
        mx, my = self.sum_x / n, self.sum_y / n
        var_x = max((self.sum_x2 - self.sum_x ** 2 / n) / (n - 1), 0.0)
        var_y = max((self.sum_y2 - self.sum_y ** 2 / n) / (n - 1), 0.0)
        cov = (self.sum_xy - self.sum_x * self.sum_y / n) / (n - 1)
        return max(var_y / mx ** 2 + var_x * my ** 2 / mx ** 4 - 2 * cov * my / mx ** 3, 0.0)

    @property
    def rate_variance(self) -> float | None:
        """Variance of ``rate`` (the delta method over users); None below MIN_UNITS users."""
        v = self.unit_variance
        return None if v is None else v / self.n

    @property
    def variance_df(self) -> float | None:
        """Effective degrees of freedom of ``rate_variance``: 2 (n - 1) m2^2 / (m4 - m2^2) over the
        linearised residuals d_u = (y_u - R x_u) / mx (n - 1 for normal d_u; far fewer when a few
        users carry the variance). None without the fourth-moment sums or a variance; inf when
        every residual has the same size (m4 = m2^2)."""
        if self.fourth is None or self.rate_variance is None:
            return None
        n, r = self.n, self.sum_y / self.sum_x
        # sum (y - r x)^2 and sum (y - r x)^4, expanded over the per-user sums
        s2 = self.sum_y2 - 2 * r * self.sum_xy + r * r * self.sum_x2
        x4, x3y, x2y2, xy3, y4 = self.fourth
        s4 = y4 - 4 * r * xy3 + 6 * r ** 2 * x2y2 - 4 * r ** 3 * x3y + r ** 4 * x4
        m2, m4 = s2 / n, s4 / n
        excess = m4 - m2 * m2
        if m2 <= 0:
            return None
        if excess <= 1e-12 * m2 * m2:
            return math.inf
        return min(2 * (n - 1) * m2 * m2 / excess, float(n - 1))

    @property
    def design_effect(self) -> float | None:
        """``rate_variance`` over what treating every x as an independent trial would give
        (p (1 - p) / sum x): how much clustering inflates the variance (1: none)."""
        v, p = self.rate_variance, self.rate
        if v is None or p is None or p in (0.0, 1.0):
            return None
        return v / (p * (1 - p) / self.sum_x)


def _critical(alpha: float, df: float | None) -> float:
    """Two-sided critical value: Student's t at ``df`` degrees of freedom, the normal's for None / inf."""
    z = _z_critical(alpha)
    return z if df is None or math.isinf(df) else float(sps.t.isf(alpha / 2, df))


def welch_df(control: RatioStat, treatment: RatioStat) -> float | None:
    """Welch-Satterthwaite degrees of freedom of the difference's variance (None: an arm lacks its
    fourth moments or a variance; inf: both variances exact)."""
    vc, vt, dc, dt = control.rate_variance, treatment.rate_variance, control.variance_df, treatment.variance_df
    if vc is None or vt is None or dc is None or dt is None:
        return None
    spread = (vc * vc / dc if vc else 0.0) + (vt * vt / dt if vt else 0.0)
    return math.inf if spread == 0 else (vc + vt) ** 2 / spread


def ratio_interval(stat: RatioStat, alpha: float = DEFAULT_ALPHA) -> RateInterval:
    """Two-sided (1 - alpha) interval of the ratio (delta-method SE; Student's t at
    ``variance_df`` when the fourth moments are known, else normal), clipped to [0, 1]."""
    z = _critical(alpha, stat.variance_df)
    if stat.rate is None:
        return RateInterval(None, None, None, "no_data", "no requests")
    variance = stat.rate_variance
    if variance is None:
        return RateInterval(stat.rate, None, None, "no_data", f"need {MIN_UNITS}+ users for a variance")
    if variance == 0.0:
        return RateInterval(stat.rate, None, None, "zero_variance", "every user had the same rate")
    half = z * math.sqrt(variance)
    return RateInterval(stat.rate, max(0.0, stat.rate - half), min(1.0, stat.rate + half), "ok")


def _diff_variance(control: RatioStat, treatment: RatioStat) -> tuple[float | None, str]:
    if control.rate is None or treatment.rate is None:
        return None, "an arm has no requests"
    vc, vt = control.rate_variance, treatment.rate_variance
    if vc is None or vt is None:
        return None, f"an arm has fewer than {MIN_UNITS} users"
    return vc + vt, ""


def diff_of_ratios(control: RatioStat, treatment: RatioStat, alpha: float = DEFAULT_ALPHA) -> DiffResult:
    """Fixed-horizon two-sided test of ``treatment.rate - control.rate`` with users as the
    unit (independent arms, delta-method variances; valid once, at a planned sample size).
    With both arms' fourth moments: Welch's t at ``welch_df`` (``z`` holds the t statistic,
    ``detail`` the df); without: the normal z-test."""
    df = welch_df(control, treatment)
    z_crit = _critical(alpha, df)
    pc, pt = control.rate, treatment.rate
    variance, why = _diff_variance(control, treatment)
    if variance is None:
        return DiffResult(pc, pt, None if pc is None or pt is None else pt - pc, None, None, None, None,
                          "no_data", why)
    diff = pt - pc
    if variance == 0.0:
        return DiffResult(pc, pt, diff, None, None, None, None, "zero_variance", "no between-user variance")
    se = math.sqrt(variance)
    z = diff / se
    if df is None or math.isinf(df):
        p_value, detail = float(2 * sps.norm.sf(abs(z))), "normal"
    else:
        p_value, detail = float(2 * sps.t.sf(abs(z), df)), f"Welch t, {df:.1f} df"
    return DiffResult(pc, pt, diff, diff - z_crit * se, diff + z_crit * se, p_value, z, "ok", detail)


def bayes_compare_ratios(control: RatioStat, treatment: RatioStat) -> BayesResult:
    """Chance that treatment's rate is higher, and the expected losses, under the normal
    (flat-prior) posterior of the difference with the delta-method variance."""
    variance, why = _diff_variance(control, treatment)
    if variance is None:
        return BayesResult(None, None, None, "no_data", why)
    if variance == 0.0:
        return BayesResult(None, None, None, "zero_variance", "no between-user variance")
    d, s = treatment.rate - control.rate, math.sqrt(variance)
    density = s * float(sps.norm.pdf(d / s))
    loss_t = density - d * float(sps.norm.cdf(-d / s))  # E[max(C - T, 0)]
    loss_c = density + d * float(sps.norm.cdf(d / s))  # E[max(T - C, 0)]
    return BayesResult(float(sps.norm.cdf(d / s)), max(loss_t, 0.0), max(loss_c, 0.0), "ok")


def sequential_test_ratios(control: RatioStat, treatment: RatioStat, alpha: float = DEFAULT_ALPHA,
                           mixture_sd: float = DEFAULT_MIXTURE_SD, previous_p: float = 1.0) -> SequentialResult:
    """One look of the mSPRT (``stats.msprt_statistic``) on the difference of two ratios, with
    users as the unit: the same always-valid p-value and confidence sequence as
    ``stats.sequential_test``, the variance from the delta method instead of Bernoulli trials."""
    _z_critical(alpha)
    variance, why = _diff_variance(control, treatment)
    if variance is None:
        return SequentialResult(None, None, previous_p, None, None, previous_p <= alpha, "no_data", why)
    diff = treatment.rate - control.rate
    if variance == 0.0:
        return SequentialResult(diff, None, previous_p, None, None, previous_p <= alpha, "zero_variance",
                                "no between-user variance")
    lr = msprt_statistic(diff, variance, mixture_sd)
    p_value = min(previous_p, 1.0 / lr, 1.0)
    half = confidence_sequence_halfwidth(variance, alpha, mixture_sd)
    return SequentialResult(diff, lr, p_value, diff - half, diff + half, p_value <= alpha, "ok")


def sequential_path_ratios(control_path: Sequence[RatioStat], treatment_path: Sequence[RatioStat],
                           alpha: float = DEFAULT_ALPHA, mixture_sd: float = DEFAULT_MIXTURE_SD) -> SequentialResult:
    """The mSPRT after a sequence of looks at cumulative per-user statistics (one per bucket)."""
    if len(control_path) != len(treatment_path):
        raise ValueError("control and treatment paths must have the same number of looks")
    result = SequentialResult(None, None, 1.0, None, None, False, "no_data", "no looks")
    p = 1.0
    for c, t in zip(control_path, treatment_path):
        result = sequential_test_ratios(c, t, alpha, mixture_sd, previous_p=p)
        p = result.p_value if result.p_value is not None else p
    return result
