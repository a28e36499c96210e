"""dashboard.control.whatif: the hit rate a threshold would have had on the logged decisions."""
import pandas as pd
import pytest

from dashboard.control import whatif


HIST = pd.DataFrame({
    # control: 4 decisions at sims 0.95 (hit), 0.85 (miss), 0.70 (miss), empty index (miss)
    # treatment: 0.85 hit, 0.81 hit but a guard blocked one of two at 0.81
    "arm": ["control", "control", "control", "control", "treatment", "treatment"],
    "similarity_milli": pd.array([950, 850, 700, None, 850, 810], dtype="Int64"),
    "decisions": [1, 1, 1, 1, 2, 2],
    "hits": [1, 0, 0, 0, 2, 1],
    "guard_blocks": [0, 0, 0, 0, 0, 1],
})


def test_whatif_at_current_threshold_reproduces_observed():
    got = whatif.whatif_hit_rate(HIST, 0.90).set_index("arm")
    assert got.loc["control", "est_hit_rate"] == got.loc["control", "observed_hit_rate"] == 0.25


def test_whatif_lower_threshold_more_hits_guards_still_block():
    got = whatif.whatif_hit_rate(HIST, 0.70).set_index("arm")
    assert got.loc["control", "est_hits"] == 3  # the empty-index lookup stays a miss
    assert got.loc["treatment", "est_hits"] == 3  # one of four was guard-blocked
    assert got.loc["treatment", "est_hit_rate"] == 0.75


def test_whatif_threshold_exactly_on_a_bin_edge_counts_it():
    got = whatif.whatif_hit_rate(HIST, 0.85).set_index("arm")
    assert got.loc["control", "est_hits"] == 2


def test_whatif_empty_and_invalid():
    assert whatif.whatif_hit_rate(HIST.iloc[0:0], 0.8).empty
    with pytest.raises(ValueError):
        whatif.whatif_hit_rate(HIST, 1.5)


def test_whatif_curve_is_monotone():
    curve = whatif.whatif_curve(HIST)
    for _, arm_curve in curve.groupby("arm"):
        rates = arm_curve.sort_values("threshold")["est_hit_rate"].tolist()
        assert rates == sorted(rates, reverse=True)
    assert set(curve["arm"]) == {"control", "treatment"}
