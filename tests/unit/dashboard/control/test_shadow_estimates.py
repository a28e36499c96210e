"""dashboard.control.shadow_estimates and its use in tuning and canary verdicts: near-miss shadow
verdicts measure the false-hit curve below the current threshold (simulated traffic with a known
truth), kept apart from users' verdicts."""
import numpy as np
import pandas as pd
import pytest

from cache_core.experiments import CanaryConfig
from dashboard.control import tuning
from dashboard.control.canary import evaluate_canary
from dashboard.control.guardrails import Guardrails
from dashboard.control.shadow_estimates import shadow_table
from dashboard.control.stats import ProportionStat
from dashboard.control.target_test import upper_confidence_bound

NOW = 10_000_000
G = Guardrails(target_false_hit_rate=0.05, min_decisions=100, min_labelled=30, max_step=0.03, cooldown_s=600)


def _hist(rows):
    """rows: (similarity_milli, decisions, hits)."""
    return pd.DataFrame([{"arm": "a", "intent_cluster": 1, "similarity_milli": s, "decisions": d, "hits": h,
                          "guard_blocks": 0} for s, d, h in rows]).astype({"similarity_milli": "Int64"})


def _shadow(rows):
    """rows: (decision, similarity_milli, correct, wrong)."""
    return pd.DataFrame([{"arm": "a", "intent_cluster": 1, "decision": d, "similarity_milli": s, "correct": c,
                          "wrong": w} for d, s, c, w in rows])


def test_the_estimate_weights_each_part_by_its_decisions_not_by_its_checks():
    # 100 hits at 0.95 (20 checked, 2 wrong), 50 near-misses at 0.88 (10 checked, 5 wrong): near-misses are
    # checked at twice the rate, so pooling the 30 checks (7/30 = 23%) would overstate the band's weight.
    hist = _hist([(950, 100, 100), (880, 50, 0), (700, 40, 0)])
    shadow = _shadow([("hit", 950, 18, 2), ("miss", 880, 5, 5)])
    row = shadow_table(hist, shadow, [0.88, 0.90, 0.85], alpha=0.05).set_index("threshold")
    assert row.loc[0.88, "shadow_false_hit_rate"] == pytest.approx((100 * 0.1 + 50 * 0.5) / 150)
    expected_upper = (100 * upper_confidence_bound(ProportionStat(20, 2), 0.025)
                      + 50 * upper_confidence_bound(ProportionStat(10, 5), 0.025)) / 150
    assert row.loc[0.88, "shadow_false_hit_upper"] == pytest.approx(expected_upper)
    assert row.loc[0.88, "shadow_hit_checks"] == 20 and row.loc[0.88, "shadow_near_miss_checks"] == 10
    assert row.loc[0.90, "shadow_false_hit_rate"] == pytest.approx(0.1)         # hits only above the band
    assert row.loc[0.88, "shadow_supported"] and row.loc[0.90, "shadow_supported"]
    assert not row.loc[0.85, "shadow_supported"]   # below the lowest checked near-miss: unjudged misses


def simulated(seed=3, band_wrong=0.01, per_bin=40, threshold=900, hit_rate=0.25, near_miss_rate=0.5, band=100):
    """An arm at ``threshold``/1000 with decisions uniform over 0.700-0.999; the truth: 1% of would-be
    hits wrong at 0.890 and up, ``band_wrong`` in 0.860-0.889, 30% below. Shadow checks: ``hit_rate``
    of hits, ``near_miss_rate`` of misses within ``band``/1000 below the threshold. Users: 5 labels per
    hit bin (none below the threshold: they only see hits)."""
    rng = np.random.default_rng(seed)
    bins = np.arange(700, 1000)
    truth = truth_by_bin(band_wrong)
    hist = _hist([(int(s), per_bin, per_bin if s >= threshold else 0) for s in bins])
    shadow, users = [], []
    for s, p in zip(bins, truth):
        if s >= threshold:
            n = rng.binomial(per_bin, hit_rate)
            w = rng.binomial(n, p)
            shadow.append(("hit", int(s), n - w, w))
            uw = rng.binomial(5, p)
            users.append({"arm": "a", "intent_cluster": 1, "similarity_milli": int(s), "threshold_milli": threshold,
                          "correct": 5 - uw, "wrong": uw})
        elif s >= threshold - band:
            n = rng.binomial(per_bin, near_miss_rate)
            w = rng.binomial(n, p)
            shadow.append(("miss", int(s), n - w, w))
    return hist, pd.DataFrame(users), _shadow(shadow)


def truth_by_bin(band_wrong):
    bins = np.arange(700, 1000)
    return np.where(bins >= 890, 0.01, np.where(bins >= 860, band_wrong, 0.30))


def true_rate(threshold, band_wrong):
    bins = np.arange(700, 1000)
    return truth_by_bin(band_wrong)[bins >= round(threshold * 1000)].mean()


def test_users_alone_cannot_go_below_the_threshold_near_miss_verdicts_can():
    hist, users, shadow = simulated()
    alone = tuning.recommend("a", 0.90, hist, users, G, now_ms=NOW)
    assert alone.action == "hold" and alone.recommended == pytest.approx(0.90)
    assert tuning.exploration(alone).action == "explore"   # users alone need a canary to learn below
    rec = tuning.recommend("a", 0.90, hist, users, G, now_ms=NOW, shadow_labelled=shadow)
    assert rec.action == "change" and rec.recommended == pytest.approx(0.87)   # one max step down
    assert rec.basis == "shadow" and "shadow verdicts" in rec.reason and rec.false_hit_upper <= 0.05
    assert rec.recommended_hit_rate > rec.current_hit_rate and rec.shadow_labelled > 300


def test_a_bad_band_below_the_threshold_is_not_served_nor_explored():
    hist, users, shadow = simulated(band_wrong=0.5)   # 0.860-0.889 would be half wrong
    assert true_rate(0.87, 0.5) > 0.08 and true_rate(0.88, 0.5) > 0.05 > true_rate(0.885, 0.5)
    rec = tuning.recommend("a", 0.90, hist, users, G, now_ms=NOW, shadow_labelled=shadow)
    assert rec.recommended is None or rec.recommended >= 0.885
    table = rec.candidates.set_index("threshold")
    assert table.loc[0.87, "shadow_supported"] and table.loc[0.87, "shadow_false_hit_upper"] > 0.05
    assert not table.loc[0.87, "feasible"] and not table.loc[0.88, "feasible"]
    assert tuning.exploration(rec) is None   # a shadow-measured bad band is not explored on a canary either


@pytest.mark.parametrize("band_wrong", [0.25, 0.4])
def test_over_many_seeds_the_shadow_recommendation_keeps_the_target(band_wrong):
    """Over 20 simulated runs the chosen threshold's true false-hit rate stays under the target (the
    mixture bound holds, not just the point estimate), and the near-misses still buy hit rate."""
    over = lowered = 0
    for seed in range(20):
        hist, users, shadow = simulated(seed=seed, band_wrong=band_wrong)
        rec = tuning.recommend("a", 0.90, hist, users, G, now_ms=NOW, shadow_labelled=shadow)
        chosen = rec.recommended if rec.recommended is not None else 0.90
        over += true_rate(chosen, band_wrong) > 0.05
        lowered += chosen < 0.90 - 1e-9
    assert over <= 1 and lowered >= 10


def test_a_canary_is_judged_on_users_and_shadow_verdicts_apart():
    canary = CanaryConfig(threshold=0.85, share=0.1, target_false_hit_rate=0.05)
    users_few = ProportionStat(5, 0)
    promote = evaluate_canary(canary, users_few, shadow=ProportionStat(400, 2))
    assert promote.action == "promote" and "shadow" in promote.reason
    rollback = evaluate_canary(canary, ProportionStat(40, 0), shadow=ProportionStat(100, 30))
    assert rollback.action == "rollback" and "by shadow" in rollback.reason
    users_bad = evaluate_canary(canary, ProportionStat(100, 30), shadow=ProportionStat(400, 2))
    assert users_bad.action == "rollback" and "by users" in users_bad.reason
    unsure = evaluate_canary(canary, users_few, shadow=ProportionStat(10, 0))
    assert unsure.action == "continue"
    assert evaluate_canary(canary, users_few, shadow=ProportionStat(0, 0)) == evaluate_canary(canary, users_few)
