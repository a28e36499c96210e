"""Evidence for error-bounded thresholds: one-sided Clopper–Pearson bounds on the wrong share of
weighted verdicts, and the cuts and margin they certify (cache_core.decision.error_bound).

Why. The curves (cache_core.decision.error_curves) say *where* each level should cut, but their
bound is a model's: a logistic curve falls toward 0 at the top of the similarity range, so it
promises small δ where the traffic has a floor of wrong answers (banking77: near-identical
questions with different intents, 2.6% wrong at similarity >= 0.97), and a cluster shrunk toward
its arm moves below it on a handful of correct verdicts. At δ = 0.02 a run's wrong share then rests
on 1-4 wrong hits and overshot (bench.error_bound: 2.1-5.3% over five seeds). A promise that small
has to rest on how many verdicts stand behind it: with none wrong, a one-sided 95% bound reaches
2% only after 149 of them (59 for 5%, 29 for 10%).

The bound. Clopper–Pearson (exact binomial), one-sided, at the policy's ``confidence`` (0.95 by
default: the quantile the curves use too, and what vCache's guarantee is stated with, P(error rate
<= δ) >= 1 - ε). Weighted verdicts (1 / check probability) enter as the Kish effective number
n = (sum w)^2 / sum w^2 with the weighted wrong share k / n, so a hit checked at a quarter of the
near-misses' rate weighs four times in the share and unequal weights shrink n instead of
multiplying it. The sets tested are nested (verdicts at or above a cut or margin); the lowest passing
one is taken rather than stopping at the first failure, so one wrong verdict among the few at the top
does not block the larger sets below it (the staircase's flaw). That choice among nested tests
costs some of the nominal confidence; the bench measures what is left.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.stats import beta


@lru_cache(maxsize=65_536)
def wrong_upper_bound(wrong: int, n: int, confidence: float) -> float:
    """One-sided Clopper–Pearson upper bound on the wrong share, ``wrong`` of ``n`` verdicts."""
    if n <= 0 or wrong >= n:
        return 1.0
    return float(beta.ppf(confidence, wrong + 1, n - wrong))


def evidence_threshold(sims: np.ndarray, wrong: np.ndarray, weights: np.ndarray | None, delta: float,
                       confidence: float, needed: int, floor: float, step: float, nothing: float,
                       top: float = 1.0) -> float | None:
    """The lowest grid cut (``top`` down to ``floor`` by ``step``) at which a level's own verdicts, with
    no curve, certify ``delta``: the one-sided Clopper–Pearson upper bound at ``confidence`` on the
    wrong share of its verdicts at or above the cut is at most ``delta``. Weighted verdicts count as
    the Kish effective number n = (sum w)^2 / sum w^2 with the weighted wrong share, so one wrong hit
    checked at a quarter of the rate weighs four times, and cannot hide behind many cheap near-misses.
    A cut needs ``needed`` effective verdicts at or above it to be tested at all. ``nothing`` if no
    tested cut passes; None if no cut can be tested (too few verdicts: the level does not speak)."""
    sims = np.asarray(sims, dtype=np.float64)
    if len(sims) == 0:
        return None
    grid, n_eff, k_eff = _at_or_above(sims, wrong, weights, np.arange(top, floor - 1e-9, -step))
    testable = n_eff >= needed - 1e-9
    if not testable.any():
        return None
    # Nested sets, so no stop at the first failure: a wrong verdict near the top fails the small
    # sets there, not the larger ones below that outweigh it (module docstring: the cost of that).
    upper_bound = np.where(k_eff < n_eff - 1e-9,
                           beta.ppf(confidence, k_eff + 1.0, np.maximum(n_eff - k_eff, 1e-9)), 1.0)
    passing = grid[testable & (upper_bound <= delta)]
    return float(passing.min()) if len(passing) else nothing


def unsafe_cuts(sims: np.ndarray, wrong: np.ndarray, weights: np.ndarray | None, delta: float,
                confidence: float, step: float) -> np.ndarray:
    """The grid cuts (multiples of ``step``) from which a level's own verdicts *show* δ broken: the
    Clopper–Pearson lower bound at ``confidence`` on the wrong share of its verdicts at or above the
    cut exceeds ``delta`` (Kish effective counts, as ``evidence_threshold``). A monotone curve cannot
    see wrong answers concentrated at the top (near-identical questions with different answers);
    this can. Ascending; empty if none."""
    sims = np.asarray(sims, dtype=np.float64)
    if len(sims) == 0:
        return np.zeros(0)
    grid = np.round(np.arange(np.floor(sims.min() / step), np.floor(1.0 / step) + 1) * step, 10)
    grid, n_eff, k_eff = _at_or_above(sims, wrong, weights, grid)
    lower_bound = np.where(k_eff > 1e-9, beta.ppf(1.0 - confidence, np.maximum(k_eff, 1e-9), n_eff - k_eff + 1.0),
                           0.0)
    return grid[lower_bound > delta]


def raised_past_unsafe(cut: float, unsafe: np.ndarray, step: float, nothing: float) -> float:
    """The lowest grid cut at or above ``cut`` not in ``unsafe`` (``unsafe_cuts``); ``nothing`` past 1.0."""
    candidate = cut
    for bad in unsafe[unsafe >= cut - 1e-9]:
        if bad > candidate + 1e-9:
            break
        candidate = bad + step
    return nothing if candidate > 1.0 + 1e-9 else candidate


def audited_margin(margins: np.ndarray, wrong: np.ndarray, weights: np.ndarray, edges: np.ndarray, band: float,
                   delta: float, confidence: float, needed: int, step: float, top: float,
                   nothing: float) -> float | None:
    """The lowest margin m on a grid (0 up to ``top`` by ``step``) at which the verdicts at
    ``margins`` >= m (each a similarity minus its cluster's cut then) have a one-sided Clopper–Pearson
    upper bound at ``confidence`` on their weighted wrong share (Kish effective count) of at most
    ``delta``; ``nothing`` if no m does; None if no m has ``needed`` effective verdicts.

    Only verdicts from times when every lookup at margin >= m was checkable count for m: a verdict
    from a time whose thresholds stood at margin ``edges`` over the cuts was drawn from lookups at or
    above that edge minus the near-miss ``band``. Without this, stretches that served nothing
    (checks only in the band just below 1.0) fill the audit with high similarities and make the low
    margins look clean."""
    for m in np.arange(0.0, top + 1e-9, step):
        member = (margins >= m - 1e-9) & (edges - band <= m + 1e-9)
        if not member.any():
            continue
        n_eff, k_eff = _effective(weights[member], wrong[member])
        if n_eff < needed - 1e-9:
            continue
        bound = 1.0 if k_eff >= n_eff - 1e-9 else float(beta.ppf(confidence, k_eff + 1.0, n_eff - k_eff))
        if bound <= delta:
            return float(m)
    return nothing if len(margins) and _testable(margins, weights, needed) else None


def _testable(margins: np.ndarray, weights: np.ndarray, needed: int) -> bool:
    """Whether the verdicts at margin >= 0 could test a margin at all (``needed`` effective ones)."""
    w = weights[margins >= -1e-9]
    return len(w) > 0 and _effective(w, np.zeros(len(w)))[0] >= needed - 1e-9


def _effective(weights: np.ndarray, wrong: np.ndarray) -> tuple[float, float]:
    """Kish effective count n = (sum w)^2 / sum w^2 of weighted verdicts, and its wrong ones n * (weighted
    wrong share): unequal weights shrink n rather than multiply it."""
    total = float(weights.sum())
    n_eff = total * total / float(np.square(weights).sum())
    return n_eff, n_eff * (float((weights * wrong).sum()) / total)


def _at_or_above(sims: np.ndarray, wrong, weights: np.ndarray | None,
                 grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each ``grid`` cut with verdicts at or above it (the others dropped): the cut, and those
    verdicts' ``_effective`` count and wrong count, all cuts in one pass over the sorted verdicts."""
    order = np.argsort(-sims, kind="stable")
    s, y = sims[order], np.asarray(wrong, dtype=np.float64)[order]
    w = np.ones(len(s)) if weights is None else np.asarray(weights, dtype=np.float64)[order]
    counts = len(s) - np.searchsorted(s[::-1], grid - 1e-9, side="left")
    grid, last = grid[counts > 0], counts[counts > 0] - 1
    total, squares, wrongs = np.cumsum(w)[last], np.cumsum(w * w)[last], np.cumsum(w * y)[last]
    n_eff = total * total / squares
    return grid, n_eff, n_eff * wrongs / total
