"""A/B statistics on per-arm sufficient statistics.

Everything here works on what a ClickHouse ``GROUP BY arm`` returns (a count and
a number of successes), never on raw rows, so windows and partial aggregates
merge with ``+``. A statistic that cannot be computed (no data, zero variance)
says so in ``status``; it never returns a made-up p-value or interval.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from scipy import stats as sps

Status = Literal["ok", "no_data", "zero_variance", "invalid"]
# Only the frequentist engine exists today. Bayesian (beta-binomial posterior,
# chance to beat control) and sequential (always-valid mSPRT intervals) engines
# belong next to it, taking the same ProportionStat inputs and returning the
# same result shapes, selected by this alias.
StatsEngine = Literal["frequentist"]

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

