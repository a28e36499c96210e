"""The evidence behind error-bounded thresholds (cache_core.decision.error_evidence): a cut needs
enough effective verdicts, weights count as Kish's effective number, wrong answers at the top raise
a level, and the audit does not let stretches that could not check low margins vouch for them."""
from __future__ import annotations

import numpy as np

from cache_core.decision.error_evidence import (audited_margin, evidence_threshold, raised_past_unsafe,
                                                unsafe_cuts, wrong_upper_bound)
from cache_core.experiments import verdicts_to_certify

NOTHING = 1.0 + 1e-6


def certify(sims, wrong, weights=None, delta=0.02, needed=149):
    lowest = float(np.min(sims))  # as the book calls it: never below the lowest similarity judged
    return evidence_threshold(np.asarray(sims), np.asarray(wrong, bool), weights, delta, 0.95, needed, lowest,
                              0.005, NOTHING)


def test_two_percent_needs_149_clean_verdicts_at_95_percent():
    assert verdicts_to_certify(0.02, 0.95) == 149
    assert wrong_upper_bound(0, 149, 0.95) <= 0.02 < wrong_upper_bound(0, 148, 0.95)
    sims = np.linspace(0.95, 1.0, 149)
    assert certify(sims, np.zeros(149)) == 0.95
    assert certify(sims[1:], np.zeros(148)) is None  # too few to test any cut: the level does not speak
    one_wrong = np.zeros(149)
    one_wrong[-1] = 1  # one wrong verdict at the top: no set holding it certifies 2%
    assert certify(sims, one_wrong) == NOTHING


def test_weights_count_as_the_effective_number_of_verdicts():
    sims = np.linspace(0.95, 1.0, 200)
    equal = np.full(200, 4.0)  # all checked at a quarter: the same 200 verdicts
    assert certify(sims, np.zeros(200), equal) == 0.95
    unequal = np.where(np.arange(200) % 10 == 0, 40.0, 1.0)  # Kish: 980^2 / 32180 = 29.8 effective
    assert certify(sims, np.zeros(200), unequal) is None
    wrong = np.zeros(400, bool)
    wrong[0] = True  # one wrong hit checked at 1/10 among 399 near-misses: it weighs ten
    sims = np.linspace(0.90, 1.0, 400)
    weights = np.ones(400)
    assert certify(sims, wrong, weights, delta=0.05, needed=59) is not None
    weights[0] = 10.0
    light, heavy = certify(sims, wrong, None, 0.05, 59), certify(sims, wrong, weights, 0.05, 59)
    assert heavy >= light


def test_wrong_answers_at_the_top_raise_a_level_past_them():
    sims = np.concatenate([np.linspace(0.80, 0.95, 100), np.linspace(0.97, 1.0, 20)])
    wrong = np.concatenate([np.zeros(100, bool), np.arange(20) % 2 == 0])  # half wrong at the top

    def raised(cut, wrong):
        return raised_past_unsafe(cut, unsafe_cuts(sims, wrong, None, 0.05, 0.95, 0.005), 0.005, NOTHING)

    assert raised(0.85, wrong) >= 1.0  # every set from 0.85 up to the very top holds the wrong ones
    low = np.zeros(120, bool)
    low[:30] = np.arange(30) % 2 == 0  # wrong only low down (15 of the 30 under 0.85)
    assert raised(0.80, low) > 0.80 and raised(0.90, low) == 0.90  # raised past them; above them untouched
    assert raised(0.80, np.zeros(120, bool)) == 0.80


def test_the_audit_ignores_stretches_that_could_not_check_the_margins_it_tests():
    """Served from margin 0: its verdicts span [-0.1, 0.3) and are 10% wrong in [0, 0.05). Then a long
    stretch at margin 0.2 (checks from 0.1 up) adds 400 clean verdicts at 0.1-0.3: they say nothing
    about [0, 0.1), so margin 0 must not pass on them."""
    rng = np.random.default_rng(0)
    served = rng.uniform(-0.1, 0.3, 400)
    wrong = (served >= 0) & (served < 0.05) & (rng.random(400) < 0.4)
    later = rng.uniform(0.1, 0.3, 400)
    margins = np.concatenate([served, later])
    wrongs = np.concatenate([wrong, np.zeros(400, bool)]).astype(float)
    weights = np.ones(800)
    edges = np.concatenate([np.zeros(400), np.full(400, 0.2)])
    args = (0.1, 0.05, 0.95, 59, 0.005, 0.5, NOTHING)  # a 0.1 near-miss band
    honest = audited_margin(margins, wrongs, weights, edges, *args)
    pooled = audited_margin(margins, wrongs, weights, np.zeros(800), *args)  # as if all were checkable
    assert pooled == 0.0 < honest  # pooled, the later clean verdicts dilute the 12 wrong ones below 0.05
    assert honest >= 0.02
    assert audited_margin(margins[:10], wrongs[:10], weights[:10], edges[:10], *args) is None
