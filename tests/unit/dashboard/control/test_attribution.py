"""dashboard.control.attribution: the mix/rate split adds up and attributes the right cause."""
import itertools

import pandas as pd
import pytest

from dashboard.control import attribution


def _frame(cells):
    return pd.DataFrame([{"arm": a, "intent_cluster": c, "requests": n, "hits": h} for a, c, n, h in cells])


def test_same_rates_different_mix_is_all_mix():
    df = _frame([("A", 1, 80, 40), ("A", 2, 20, 18), ("B", 1, 20, 10), ("B", 2, 80, 72)])
    d = attribution.decompose(df, "intent_cluster", "A", "B")
    assert d.rate_effect == pytest.approx(0.0)
    assert d.mix_effect == pytest.approx(d.difference)
    assert d.difference == pytest.approx(0.82 - 0.58)


def test_same_mix_different_rates_is_all_rate():
    df = _frame([("A", 1, 50, 10), ("A", 2, 50, 20), ("B", 1, 50, 30), ("B", 2, 50, 20)])
    d = attribution.decompose(df, "intent_cluster", "A", "B")
    assert d.mix_effect == pytest.approx(0.0)
    assert d.rate_effect == pytest.approx(0.2)


def test_equals_shapley_average_over_both_orders():
    df = _frame([("A", 1, 70, 20), ("A", 2, 30, 25), ("A", 3, 5, 1), ("B", 1, 40, 30), ("B", 2, 60, 30)])
    d = attribution.decompose(df, "intent_cluster", "A", "B")
    assert d.mix_effect + d.rate_effect == pytest.approx(d.difference)
    b = d.buckets
    rate = lambda w, r: float((b[w] * b[r]).sum())
    # Shapley: the mix factor's marginal effect averaged over switching it first or second
    shapley_mix = ((rate("w_b", "r_a") - rate("w_a", "r_a")) + (rate("w_b", "r_b") - rate("w_a", "r_b"))) / 2
    assert d.mix_effect == pytest.approx(shapley_mix)
    assert d.baseline_rate == pytest.approx(46 / 105)


def test_bucket_missing_in_one_arm_counts_as_mix():
    df = _frame([("A", 1, 50, 25), ("A", 2, 50, 25), ("B", 1, 50, 25)])
    d = attribution.decompose(df, "intent_cluster", "A", "B")
    assert d.buckets.set_index("intent_cluster").loc[2, "rate"] == 0.0


def test_empty_arm_is_a_clear_error():
    with pytest.raises(ValueError, match="no requests"):
        attribution.decompose(_frame([("A", 1, 5, 1)]), "intent_cluster", "A", "B")


def test_waterfall_steps_chain_from_baseline_to_other():
    df = _frame([("A", c, 10 + c, c) for c in range(10)] + [("B", c, 20 - c, 2 * c % 9) for c in range(10)])
    d = attribution.decompose(df, "intent_cluster", "A", "B")
    steps = attribution.waterfall_frame(d, top=3)
    assert steps["step"].iloc[0] == "A hit rate" and steps["step"].iloc[-1] == "B hit rate"
    assert "rate: other buckets" in set(steps["step"])
    middle = steps.iloc[1:-1]
    for prev, cur in itertools.pairwise(middle.itertuples()):
        assert cur.start == pytest.approx(prev.end)
    assert middle["end"].iloc[-1] == pytest.approx(d.other_rate)
