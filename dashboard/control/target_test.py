"""An exact, always-valid one-sided test of a proportion against a target (the canary's test).

A canary's false-hit rate p is judged against its target t on every auto-tune run, from
its labelled hits (k wrong of n). Small rates (t = 1-5%) and repeated looks rule out a
normal approximation and a fixed bound re-checked at every run. Here each side is a
mixture likelihood ratio, a nonnegative supermartingale under its null (Ville's inequality:
the chance it *ever* reaches 1/alpha is at most alpha, however often it is looked at):

    above (H0: p <= t):  E_n = ∫_{p > t}  (p / t)^k ((1 - p) / (1 - t))^(n - k) dπ(p)
    below (H0: p >= t):  E_n = ∫_{p < t}  (p / t)^k ((1 - p) / (1 - t))^(n - k) dπ(p)

with π a Beta prior centred on the target (mean t, sd ``relative_sd`` * t) truncated to
the alternative. For p0 on the null side, each factor's expectation is
p0 p / t + (1 - p0)(1 - p) / (1 - t) <= 1, so the product is a supermartingale for every
null rate, not only p0 = t. In closed form (B: the Beta function, F: the Beta cdf):

    E_n = B(a + k, b + n - k) / B(a, b) * Pπ_n(alt) / Pπ(alt) / (t^k (1 - t)^(n - k))

where Pπ_n is the posterior mass of the alternative. "rollback" when the above side
reaches 1/alpha, "promote" when the below side does. Labels are treated as independent
trials (users' verdicts on different hits); the wrong-rollback and wrong-promotion rates
measured under repeated looks are in bench/stats_simulation.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import special
from scipy import stats as sps

from dashboard.control.stats import DEFAULT_ALPHA, ProportionStat

DEFAULT_RELATIVE_SD = 0.5
"""Prior sd of the rate, relative to the target: the mixture spends its power on rates
within about half the target of it (at 2%: 1-3%)."""

Side = Literal["above", "below", "unsure"]


@dataclass(frozen=True)
class TargetTest:
    side: Side
    """Which side of the target the rate is on with confidence, or "unsure"."""
    e_above: float
    """The mixture martingale against "rate <= target" (>= 1/alpha: above with confidence)."""
    e_below: float
    """The mixture martingale against "rate >= target"."""

    @property
    def p_value(self) -> float:
        """Always-valid p-value of the side found (of the closer one when unsure), at this look."""
        return min(1.0, 1.0 / max(self.e_above, self.e_below, 1e-300))


def prior(target, relative_sd: float = DEFAULT_RELATIVE_SD):
    """Beta(a, b) with mean ``target`` and sd ``relative_sd * target`` (``target`` may be an array)."""
    t = np.asarray(target, dtype="float64")
    if np.any(t <= 0.0) or np.any(t >= 1.0):
        raise ValueError(f"target must be in (0, 1), got {target}")
    if relative_sd <= 0:
        raise ValueError(f"relative_sd must be positive, got {relative_sd}")
    sd = relative_sd * t
    strength = t * (1 - t) / (sd * sd) - 1
    if np.any(strength <= 0):
        raise ValueError(f"relative_sd {relative_sd} is too wide for target {target}")
    a, b = t * strength, (1 - t) * strength
    return (float(a), float(b)) if a.ndim == 0 else (a, b)


def log_e_value(wrong, n, target, side: Literal["above", "below"],
                relative_sd: float = DEFAULT_RELATIVE_SD):
    """log E_n of one side (see the module docstring); ``wrong``, ``n`` and ``target`` may be
    arrays that broadcast (the simulations evaluate every look of every run at once)."""
    wrong, n = np.asarray(wrong, dtype="float64"), np.asarray(n, dtype="float64")
    if np.any(n < 0) or np.any(wrong < 0) or np.any(wrong > n):
        raise ValueError(f"need 0 <= wrong <= n, got wrong={wrong}, n={n}")
    a, b = prior(target, relative_sd)
    post_a, post_b = a + wrong, b + n - wrong
    if side == "above":
        log_mass, log_mass0 = sps.beta.logsf(target, post_a, post_b), sps.beta.logsf(target, a, b)
    else:
        with np.errstate(divide="ignore"):  # the regularised incomplete Beta: 30x faster than
            # sps.beta.logcdf, the same values (to 1e-14, -inf where it underflows)
            log_mass, log_mass0 = np.log(special.betainc(post_a, post_b, target)), np.log(special.betainc(a, b, target))
    log_null = wrong * np.log(target) + (n - wrong) * np.log1p(-np.asarray(target, dtype="float64"))
    out = special.betaln(post_a, post_b) - special.betaln(a, b) + log_mass - log_mass0 - log_null
    return float(out) if out.ndim == 0 else out


def test_against_target(stat: ProportionStat, target: float, alpha: float = DEFAULT_ALPHA,
                        relative_sd: float = DEFAULT_RELATIVE_SD) -> TargetTest:
    """Both sides at once: "above" / "below" when that side's martingale reaches 1/alpha."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    above = math.exp(min(log_e_value(stat.successes, stat.n, target, "above", relative_sd), 700.0))
    below = math.exp(min(log_e_value(stat.successes, stat.n, target, "below", relative_sd), 700.0))
    side: Side = "above" if above >= 1 / alpha else "below" if below >= 1 / alpha else "unsure"
    return TargetTest(side, above, below)


test_against_target.__test__ = False  # a statistical test, not a pytest one


MAX_BOUND_RATE = 0.75
"""Highest rate the prior family centres on (its strength must stay positive); above it the
upper bound is reported as 1."""


def upper_confidence_bound(stat: ProportionStat, alpha: float = DEFAULT_ALPHA,
                           relative_sd: float = DEFAULT_RELATIVE_SD) -> float | None:
    """Time-uniform one-sided (1 - alpha) upper bound of the rate: the lowest rate p whose
    "below" martingale (H0: rate >= p) has reached 1/alpha. It holds over every look at
    once (a confidence sequence), so re-computing it on each auto-tune run spends no extra
    alpha; None without trials."""
    if stat.n == 0:
        return None
    return float(upper_confidence_bounds([stat.successes], [stat.n], alpha, relative_sd)[0])


def upper_confidence_bounds(wrong, n, alpha: float = DEFAULT_ALPHA,
                            relative_sd: float = DEFAULT_RELATIVE_SD) -> np.ndarray:
    """``upper_confidence_bound`` of many (wrong, n) at once (NaN where n is 0): one
    vectorised bisection, for the what-if tables' hundreds of candidates."""
    wrong, n = np.asarray(wrong, dtype="float64"), np.asarray(n, dtype="float64")
    out = np.full(wrong.shape, np.nan)
    some = n > 0
    if not some.any():
        return out
    k, m = wrong[some], n[some]
    limit = math.log(1 / alpha)
    reached = lambda p: log_e_value(k, m, p, "below", relative_sd) >= limit
    observed = np.maximum(k / m, 1e-9)
    low, high = np.minimum(observed, MAX_BOUND_RATE), np.full(k.shape, MAX_BOUND_RATE)
    never, at_once = ~reached(high), reached(low)
    for _ in range(50):  # bisection to ~1e-15 of the rate scale
        mid = (low + high) / 2
        hit = reached(mid)
        low, high = np.where(hit, low, mid), np.where(hit, mid, high)
    out[some] = np.where(never, 1.0, np.where(at_once, observed, high))
    return out
