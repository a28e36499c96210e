"""Error curves: P(wrong | similarity) as a logistic curve per level, shrunk toward the level above
(cache_core.decision.error_bound's ``curves`` estimator).

The model, per level (the arm, an intent cluster, one cached entry)::

    logit P(wrong | s) = a + b (s - CENTRE),   b <= 0 (wrong odds never rise with similarity)

fitted by Newton's method as the posterior mode under a Gaussian prior, with the posterior's
covariance (the Laplace approximation) as its uncertainty:

* the arm's prior is weak (``ARM_PRIOR``): its own verdicts decide;
* a cluster's prior is the arm's curve, widened by ``CLUSTER_SPREAD`` (how much clusters differ);
* an entry's prior is its cluster's curve, widened by ``ENTRY_SPREAD``.

So a level with no verdicts of its own *is* its parent's curve, and each verdict moves it only as
far as the evidence outweighs the spread: a young entry borrows its cluster's strength instead of
waiting for enough verdicts to decide alone. (The parent's fit also saw the child's verdicts, so a
child counts them twice; with the spreads this wide that is a small overconfidence, and it keeps
the fit a few Newton steps per level.)

The bound (``upper``): the curve's logit plus ``z`` standard deviations of its estimate. Which
variance: the level's own once it is better known than its parent; before that the parent's. A
young level's extra variance is how entries (clusters) differ from one another, which averages out
over many lookups; the share of wrong hits δ bounds is such an average, while the parent's
estimation error is shared by all its children and does not average out.

Because the curve is smooth and monotone, one wrong verdict near the top of the similarity range
moves it a little everywhere (as much as one verdict weighs among the level's), where a test run
from the top down stops there and blocks everything below.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import expit

CENTRE = 0.85
"""Similarities are centred here so the two parameters are nearly uncorrelated."""
ARM_PRIOR_MEAN = np.array([math.log(0.2 / 0.8), -20.0])
"""Before any verdict: 20% wrong at 0.85, odds falling e-fold every 0.05 (weak: see the spread)."""
ARM_PRIOR_COV = np.diag([3.0 ** 2, 20.0 ** 2])
CLUSTER_SPREAD = np.diag([1.0 ** 2, 10.0 ** 2])
"""How far a cluster's curve may sit from its arm's a priori (logit units; slope per unit similarity)."""
ENTRY_SPREAD = np.diag([1.0 ** 2, 10.0 ** 2])
"""How far an entry's curve may sit from its cluster's a priori."""
MAX_SLOPE = 0.0
NEWTON_STEPS = 30


@dataclass(frozen=True)
class Curve:
    """A fitted curve: the posterior mode ``mean`` (a, b) and its covariance ``cov``."""

    mean: np.ndarray
    cov: np.ndarray

    def logit(self, sims: np.ndarray) -> np.ndarray:
        return self.mean[0] + self.mean[1] * (np.asarray(sims, dtype=np.float64) - CENTRE)

    def variance(self, sims: np.ndarray) -> np.ndarray:
        """Variance of the logit at ``sims`` (x' cov x with x = (1, s - CENTRE))."""
        x = np.asarray(sims, dtype=np.float64) - CENTRE
        return self.cov[0, 0] + 2.0 * self.cov[0, 1] * x + self.cov[1, 1] * x * x

    def wrong(self, sims: np.ndarray) -> np.ndarray:
        """The estimate of P(wrong | s)."""
        return expit(self.logit(sims))

    def as_prior(self, spread: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """This curve as a child's prior: same mean, covariance widened by ``spread``."""
        return self.mean, self.cov + spread


ARM_PRIOR = Curve(ARM_PRIOR_MEAN, ARM_PRIOR_COV)


def fit(sims: np.ndarray, wrong: np.ndarray, prior: tuple[np.ndarray, np.ndarray],
        start: np.ndarray | None = None, weights: np.ndarray | None = None) -> Curve:
    """The posterior mode and covariance of (a, b) given verdicts ``(sims, wrong)`` and a Gaussian
    ``prior`` (mean, covariance); with no verdicts, the prior itself. The slope is held at or below
    ``MAX_SLOPE`` (monotone: where the verdicts say wrong odds rise with similarity, the level gets
    a flat curve at its wrong share). ``start``: where Newton starts (e.g. the last fit's mode: a
    refit after a few new verdicts then takes a step or two); the prior's mean by default.
    ``weights``: each verdict's inverse check probability (``fit_weights``); None: all equal."""
    prior_mean, prior_cov = prior
    if len(sims) == 0:
        return Curve(np.array(prior_mean, dtype=np.float64), np.array(prior_cov, dtype=np.float64))
    x = np.column_stack([np.ones(len(sims)), np.asarray(sims, dtype=np.float64) - CENTRE])
    y = np.asarray(wrong, dtype=np.float64)
    w = fit_weights(weights, len(sims))
    precision = np.linalg.inv(prior_cov)
    theta = np.array(prior_mean if start is None else start, dtype=np.float64)
    free = np.array([True, True])
    for _ in range(2):  # a second pass only if the slope had to be pinned
        for _ in range(NEWTON_STEPS):
            p = expit(x @ theta)
            grad = x.T @ (w * (y - p)) - precision @ (theta - prior_mean)
            hess = (x * (w * p * (1.0 - p))[:, None]).T @ x + precision
            step = np.zeros(2)
            step[free] = np.linalg.solve(hess[np.ix_(free, free)], grad[free])
            step = np.clip(step, -5.0, 5.0)  # damped: the prior keeps it concave, this keeps it calm
            theta += step
            if np.abs(step).max() < 1e-7:
                break
        if theta[1] <= MAX_SLOPE or not free[1]:
            break
        theta[1], free[1] = MAX_SLOPE, False
    p = expit(x @ theta)
    hess = (x * (w * p * (1.0 - p))[:, None]).T @ x + precision
    return Curve(theta, np.linalg.inv(hess))


def fit_weights(weights: np.ndarray | None, n: int) -> np.ndarray:
    """Verdict weights for the likelihood: proportional to ``weights`` (inverse check
    probabilities, so the fit is the one all lookups would give, not the checked sample's), scaled
    to sum to the Kish effective sample size (sum w)^2 / sum w^2, so unequal weights widen the
    curve's uncertainty instead of counting a verdict checked at rate 1/4 as four observations.
    None or equal weights: all ones (the unweighted fit)."""
    if weights is None:
        return np.ones(n)
    w = np.asarray(weights, dtype=np.float64)
    return w * (w.sum() / float(np.square(w).sum()))


def upper(curve: Curve, sims: np.ndarray, z: float, parent: Curve | None = None) -> np.ndarray:
    """The upper bound on P(wrong | s): the logit plus ``z`` standard deviations, with the smaller
    of the level's own variance and its ``parent``'s (module docstring)."""
    variance = curve.variance(sims)
    if parent is not None:
        variance = np.minimum(variance, parent.variance(sims))
    return expit(curve.logit(sims) + z * np.sqrt(np.maximum(variance, 0.0)))


def served_error_threshold(bound, population: np.ndarray, delta: float, floor: float, step: float,
                           nothing: float, weights: np.ndarray | None = None) -> float:
    """The lowest threshold θ on a grid (1.0 down to ``floor`` by ``step``, never below the lowest
    similarity of ``population``) at which the mean of ``bound(s)`` over the population's
    similarities s >= θ, the wrong share of the hits serving from θ would give, is at most
    ``delta``; ``nothing`` if no θ is. ``population``: similarities the level's lookups were found
    at (its verdicts'); above its highest one the bound at θ itself stands in. ``weights``: each
    one's inverse check probability, so the mean is over the lookups, not over the checked sample
    (near-misses are checked more often than hits); None: equal."""
    population = np.asarray(population, dtype=np.float64)
    order = np.argsort(-population, kind="stable")
    sims = population[order]
    if len(sims) == 0:
        return nothing
    w = np.ones(len(sims)) if weights is None else np.asarray(weights, dtype=np.float64)[order]
    bounds = bound(sims)
    mean_above = np.cumsum(w * bounds) / np.cumsum(w)
    grid = np.arange(1.0, max(floor, float(sims[-1])) - 1e-9, -step)
    if len(grid) == 0:
        return nothing
    counts = len(sims) - np.searchsorted(sims[::-1], grid - 1e-9, side="left")
    estimate = np.where(counts > 0, mean_above[np.maximum(counts, 1) - 1], bound(grid))
    passing = grid[estimate <= delta]
    return float(passing.min()) if len(passing) else nothing
