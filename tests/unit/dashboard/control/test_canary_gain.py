"""dashboard.control.canary_gain: a loosening canary is promoted only when its measured hit rate
confirms the replayed gain (issue 26, item 5); golden values of the gain check."""
import pandas as pd
import pytest

from cache_core.experiments import ArmConfig, CanaryConfig
from dashboard.control.canary import CanaryDecision
from dashboard.control.canary_gain import gate_promotion, loosens, measured_gain, variant_stat
from dashboard.control.ratio import RatioStat

PROMOTE = CanaryDecision("promote", "false-hit rate 0.0% (0/200) is below the target 5.0% with confidence",
                         200, 0, 0.0, 0.01)


def _arm(threshold=0.90, canary_threshold=0.87, **multi):
    canary = CanaryConfig(threshold=canary_threshold, share=0.1, target_false_hit_rate=0.05, **multi)
    return ArmConfig(name="a", threshold=threshold, canary=canary.model_dump())


def _units(base, canary):
    """canary_unit_stats rows from per-user (requests, hits) lists; one row per variant."""
    rows = []
    for variant, users in (("base", base), ("canary", canary)):
        s = RatioStat.from_units([x for x, _ in users], [y for _, y in users])
        rows.append({"variant": variant, "units": s.n, "sum_x": s.sum_x, "sum_y": s.sum_y, "sum_x2": s.sum_x2,
                     "sum_y2": s.sum_y2, "sum_xy": s.sum_xy})
    return pd.DataFrame(rows)


def test_loosens():
    assert loosens(_arm()) and not loosens(_arm(canary_threshold=0.93))
    assert not loosens(ArmConfig(name="a", threshold=0.9))
    multi = ArmConfig(name="m", threshold=0.8, similarity="multi", multi={"threshold": 0.55, "answer_margin": 0.01},
                      canary=CanaryConfig(threshold=0.8, share=0.1, score_floor=0.52).model_dump())
    assert loosens(multi)
    tighter = multi.model_copy(update={"canary": CanaryConfig(threshold=0.8, share=0.1, score_floor=0.58)})
    assert not loosens(tighter)


def test_golden_gain_check():
    base = RatioStat.from_units([10] * 500, [3] * 250 + [4] * 250)    # 35% hits
    more = RatioStat.from_units([10] * 500, [5] * 250 + [6] * 250)    # 55%
    same = RatioStat.from_units([10] * 500, [4] * 250 + [3] * 250)
    up = measured_gain(base, more)
    assert up.status == "confirmed" and round(up.diff, 5) == 0.2 and up.low > 0
    assert measured_gain(more, base).status == "refuted"
    flat = measured_gain(base, same)
    assert flat.status == "unsure" and flat.diff == 0.0 and flat.low < 0 < flat.high
    assert measured_gain(None, more).status == "no_data"


def test_a_loosening_is_promoted_only_when_the_measured_hit_rate_confirms_the_gain():
    gain = _units([(10, 3)] * 250 + [(10, 4)] * 250, [(10, 5)] * 250 + [(10, 6)] * 250)
    confirmed = gate_promotion(PROMOTE, _arm(), gain)
    assert confirmed.action == "promote" and "confirms the gain" in confirmed.reason
    flat = _units([(10, 3)] * 20 + [(10, 4)] * 20, [(10, 4)] * 20 + [(10, 3)] * 20)
    waiting = gate_promotion(PROMOTE, _arm(), flat)
    assert waiting.action == "continue" and "waiting for the measured hit rate" in waiting.reason
    loss = _units([(10, 5)] * 250 + [(10, 6)] * 250, [(10, 3)] * 250 + [(10, 4)] * 250)
    refuted = gate_promotion(PROMOTE, _arm(), loss)
    assert refuted.action == "rollback" and "did not happen" in refuted.reason
    assert gate_promotion(PROMOTE, _arm(), None).action == "continue"  # no measurement: no promotion


@pytest.mark.parametrize("decision", [PROMOTE, CanaryDecision("rollback", "r", 10, 5, 0.5, 0.01),
                                      CanaryDecision("continue", "c", 10, 0, 0.0, 0.5)])
def test_tightening_canaries_and_other_verdicts_pass_unchanged(decision):
    flat = _units([(10, 3)] * 20, [(10, 3)] * 20)
    assert gate_promotion(decision, _arm(canary_threshold=0.93), flat) == decision
    if decision.action != "promote":
        assert gate_promotion(decision, _arm(), flat) == decision


def test_variant_stat_reads_the_query_rows():
    units = _units([(2, 1), (4, 1)], [(1, 1)])
    assert variant_stat(units, "base") == RatioStat(2, 6.0, 2.0, 20.0, 2.0, 6.0)
    assert variant_stat(units, "holdout") is None and variant_stat(None, "base") is None


def test_recommend_says_a_lowering_rests_on_fixed_contents():
    """Issue 26, item 5: tuning.recommend's output says what its hit rates hold fixed (lowering only)."""
    import numpy as np
    from dashboard.control import tuning
    from dashboard.control.guardrails import Guardrails
    bins = np.arange(700, 1000)
    hist = pd.DataFrame({"arm": "a", "intent_cluster": 1, "similarity_milli": pd.array(bins, dtype="Int64"),
                         "decisions": 10, "hits": 0, "guard_blocks": 0})
    labels = pd.DataFrame({"arm": "a", "intent_cluster": 1, "similarity_milli": bins[120:], "correct": 5, "wrong": 0})
    g = Guardrails(target_false_hit_rate=0.05, min_decisions=100, min_labelled=30, max_step=0.03, cooldown_s=600)
    lower = tuning.recommend("a", 0.88, hist, labels, g, now_ms=10**7)
    assert lower.action == "change" and lower.recommended < 0.88 and tuning.FIXED_CONTENTS in lower.reason
    explore = tuning.exploration(tuning.recommend("a", 0.82, hist, labels, g, now_ms=10**7))
    assert explore.action == "explore" and tuning.FIXED_CONTENTS in explore.reason
    labels_wrong = labels.assign(wrong=2, correct=3)
    higher = tuning.recommend("a", 0.88, hist, labels_wrong, g, now_ms=10**7)
    assert higher.recommended > 0.88 and tuning.FIXED_CONTENTS not in higher.reason
