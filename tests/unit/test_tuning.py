"""dashboard.tuning: guarded threshold recommendations and canary verdicts."""
import numpy as np
import pandas as pd
import pytest

from cache_core.experiments import ArmConfig, CanaryConfig, ExperimentConfig
from dashboard import control, tuning
from dashboard.stats import ProportionStat

NOW = 10_000_000


def _hist(arm="a", cluster=1, lo=700, hi=1000, per_bin=10):
    bins = np.arange(lo, hi)
    return pd.DataFrame({"arm": arm, "intent_cluster": cluster, "similarity_milli": pd.array(bins, dtype="Int64"),
                         "decisions": per_bin, "hits": 0, "guard_blocks": 0})


def _labels(arm="a", cluster=1, lo=820, wrong_below=850, wrong_every=10):
    """5 labels per bin from ``lo``; 2 of 5 wrong below ``wrong_below``, else 1 wrong every ``wrong_every`` bins."""
    bins = np.arange(lo, 1000)
    wrong = np.where(bins < wrong_below, 2, (bins % wrong_every == 0).astype(int))
    return pd.DataFrame({"arm": arm, "intent_cluster": cluster, "similarity_milli": bins,
                         "correct": 5 - wrong, "wrong": wrong})


G = tuning.Guardrails(target_false_hit_rate=0.05, min_decisions=100, min_labelled=30, max_step=0.03, cooldown_s=600)


def test_table_hit_rate_agrees_with_control_whatif():
    hist = _hist()
    table = tuning.threshold_table(hist, _labels(), [0.85]).iloc[0]
    whatif = control.whatif_hit_rate(hist, 0.85).iloc[0]
    assert table["est_hit_rate"] == pytest.approx(whatif["est_hit_rate"]) == pytest.approx(150 / 300)
    assert table["labelled"] == 750 and table["wrong"] == 15


def test_recommends_lowest_safe_threshold_within_max_step():
    rec = tuning.recommend("a", 0.88, _hist(), _labels(), G, now_ms=NOW)
    assert rec.action == "change"
    assert rec.recommended == pytest.approx(0.85)  # 0.03 below; 0.84 would add the 40%-wrong band
    assert rec.false_hit_upper <= 0.05
    assert rec.recommended_hit_rate > rec.current_hit_rate
    assert set(rec.candidates["threshold"]) >= {0.85, 0.88, 0.91}


def test_the_unsafe_band_is_avoided_even_when_allowed():
    wide = tuning.Guardrails(target_false_hit_rate=0.05, min_decisions=100, max_step=0.08)
    rec = tuning.recommend("a", 0.88, _hist(), _labels(), wide, now_ms=NOW)
    upper_at = rec.candidates.set_index("threshold")["false_hit_upper"]
    assert upper_at[0.82] > 0.05
    assert 0.82 < rec.recommended <= 0.85


def test_over_target_everywhere_raises_by_the_max_step():
    strict = tuning.Guardrails(target_false_hit_rate=0.01, min_decisions=100, max_step=0.03)
    rec = tuning.recommend("a", 0.88, _hist(), _labels(), strict, now_ms=NOW)
    assert (rec.action, rec.recommended) == ("change", pytest.approx(0.91))
    assert "above target" in rec.reason


def test_never_recommends_below_the_labelled_support():
    rec = tuning.recommend("a", 0.88, _hist(), _labels(lo=880), G, now_ms=NOW)
    assert rec.action == "hold" and "already the best" in rec.reason
    assert not rec.candidates.set_index("threshold").loc[0.875, "supported"]


def test_guardrails_hold():
    few = tuning.recommend("a", 0.88, _hist(per_bin=0), _labels(), G, now_ms=NOW)
    assert few.action == "hold" and "logged decisions" in few.reason
    cooling = tuning.recommend("a", 0.88, _hist(), _labels(), G, now_ms=NOW, last_change_ms=NOW - 60_000)
    assert cooling.action == "hold" and "cool-down" in cooling.reason
    cooled = tuning.recommend("a", 0.88, _hist(), _labels(), G, now_ms=NOW, last_change_ms=NOW - 700_000)
    assert cooled.action == "change"
    no_labels = tuning.recommend("a", 0.88, _hist(), _labels().iloc[0:0], G, now_ms=NOW)
    assert no_labels.action == "hold" and "labelled" in no_labels.reason


def test_invalid_guardrails():
    with pytest.raises(ValueError, match="target"):
        tuning.Guardrails(target_false_hit_rate=0)


def test_recommend_all_per_cluster_uses_cluster_threshold_and_skips_canaries():
    config = ExperimentConfig(experiment_id="e", salt="s", arms=[
        ArmConfig(name="a", threshold=0.88, cluster_thresholds={2: 0.9}),
        ArmConfig(name="b", threshold=0.8, canary=CanaryConfig(threshold=0.78, share=0.1))])
    hist = pd.concat([_hist(cluster=1), _hist(cluster=2)])
    labels = pd.concat([_labels(cluster=1), _labels(cluster=2)])
    recs = tuning.recommend_all(config, hist, labels, G, now_ms=NOW, clusters=True)
    assert [(r.arm, r.cluster) for r in recs] == [("a", None), ("a", 1), ("a", 2)]
    assert recs[2].current == 0.9


@pytest.mark.parametrize("method", ["sequential", "bound"])
def test_evaluate_canary(method):
    canary = CanaryConfig(threshold=0.8, share=0.1, target_false_hit_rate=0.05)
    bad = tuning.evaluate_canary(canary, ProportionStat(300, 45), method=method)
    good = tuning.evaluate_canary(canary, ProportionStat(2000, 20), method=method)
    early = tuning.evaluate_canary(canary, ProportionStat(20, 1), method=method)
    few_but_clean = tuning.evaluate_canary(canary, ProportionStat(10, 0), min_labelled=30, method=method)
    assert (bad.action, good.action, early.action, few_but_clean.action) == ("rollback", "promote", "continue", "continue")
    assert "above the target" in bad.reason and "labels" in few_but_clean.reason


def test_sequential_canary_is_stricter_than_a_fixed_bound_when_borderline():
    canary = CanaryConfig(threshold=0.8, share=0.1, target_false_hit_rate=0.05)
    borderline = ProportionStat(400, 30)  # 7.5%: a fixed bound says above, the always-valid test waits
    assert tuning.evaluate_canary(canary, borderline, method="bound").action == "rollback"
    assert tuning.evaluate_canary(canary, borderline, method="sequential").action == "continue"


# -- multi-similarity arms: the what-if re-applies the score floor / answer margin ------

def _multi_hist(lo=800, hi=1000, per_bin=10, refused_below=900, refused=4, logged_at=0.85):
    """Multi-arm bins: ``refused`` of ``per_bin`` decisions per bin under ``refused_below``
    fail the current floor / margin; logged at cosine threshold ``logged_at``."""
    hist = _hist(lo=lo, hi=hi, per_bin=per_bin)
    hist["multi_blocks"] = np.where(hist["similarity_milli"].to_numpy() < refused_below, refused, 0)
    hist["multi_min_threshold"] = logged_at
    return hist


def test_multi_whatif_counts_only_what_the_floor_and_margin_would_serve():
    multi, cosine = _multi_hist(), _hist(lo=800)
    at = lambda hist: tuning.threshold_table(hist, _labels(), [0.85, 0.95]).set_index("threshold")
    m, c = at(multi), at(cosine)
    # 150 bins of 10 at or above 0.85; in the 50 bins under 0.90 the mixed rule refuses 4 of 10.
    assert c.at[0.85, "est_hits"] == 1500 and m.at[0.85, "est_hits"] == 1500 - 200
    assert m.at[0.95, "est_hits"] == c.at[0.95, "est_hits"] == 500  # no refusals up there
    assert m.at[0.85, "est_hit_rate"] < c.at[0.85, "est_hit_rate"]
    whatif = control.whatif_hit_rate(multi, 0.85).iloc[0]
    assert whatif["est_hits"] == m.at[0.85, "est_hits"]  # the control panel's what-if agrees


def test_cosine_arm_unchanged_by_the_multi_columns():
    plain = _hist()
    with_zero_cols = plain.assign(multi_blocks=0, multi_min_threshold=np.nan)
    grid = [0.80, 0.85, 0.90]
    a = tuning.threshold_table(plain, _labels(), grid)
    b = tuning.threshold_table(with_zero_cols, _labels(), grid)
    pd.testing.assert_frame_equal(a.drop(columns="replayable"), b.drop(columns="replayable"))
    assert b["replayable"].all() and tuning.replay_floor(with_zero_cols) is None
    assert tuning.recommend("a", 0.88, with_zero_cols, _labels(), G, now_ms=NOW).recommended == pytest.approx(0.85)


def test_multi_arm_never_recommended_below_the_lowest_logged_threshold():
    # Same data that makes a cosine arm step down from 0.88 to 0.85 (see above), but the
    # multi arm's scores were logged with its cosine gate at 0.87: 0.85 / 0.86 cannot be replayed.
    hist = _multi_hist(refused=0, logged_at=0.87)
    rec = tuning.recommend("a", 0.88, hist, _labels(), G, now_ms=NOW)
    table = rec.candidates.set_index("threshold")
    assert not table.loc[0.85, "supported"] and not table.loc[0.86, "replayable"]
    assert table.loc[0.87, "replayable"] and table.loc[0.87, "supported"]
    assert rec.action == "change" and rec.recommended == pytest.approx(0.87)
    assert tuning.recommend("a", 0.88, _hist(), _labels(), G, now_ms=NOW).recommended == pytest.approx(0.85)


def test_drop_unreplayable_keeps_cosine_arms_whole():
    curve = pd.DataFrame({"arm": ["m", "m", "m", "c", "c"], "threshold": [0.80, 0.85, 0.90, 0.80, 0.90],
                          "est_hit_rate": [0.5, 0.4, 0.3, 0.5, 0.3]})
    hist = pd.concat([_multi_hist(logged_at=0.85).assign(arm="m"), _hist().assign(arm="c")])
    kept = tuning.drop_unreplayable(curve, hist)
    assert kept[["arm", "threshold"]].values.tolist() == [["m", 0.85], ["m", 0.90], ["c", 0.80], ["c", 0.90]]


def _margins():
    """A multi arm's decisions past the floor by answer-margin bin (NA: no rival answer)."""
    return pd.DataFrame({
        "arm": "m",
        "margin_milli": pd.array([None, 2, 5, 8, 20, 60], dtype="Int64"),
        "decisions": [40, 10, 10, 10, 10, 10],
        "correct": [38, 0, 4, 7, 9, 10],  # hits at the logged margin 0.005 carry labels
        "wrong": [2, 0, 6, 3, 1, 0],
    })


def test_margin_table_replays_other_margins():
    table = tuning.margin_table(_margins(), 200, [0.0, 0.005, 0.01, 0.05, 0.1]).set_index("answer_margin")
    # No-rival decisions are served at any margin; the others once their lead reaches it.
    assert table["est_hits"].to_dict() == {0.0: 90, 0.005: 80, 0.01: 60, 0.05: 50, 0.1: 40}
    assert table.at[0.005, "est_hit_rate"] == pytest.approx(80 / 200)
    assert (table.at[0.005, "labelled"], table.at[0.005, "wrong"]) == (80, 12)
    assert (table.at[0.01, "labelled"], table.at[0.01, "wrong"]) == (60, 3)  # a wider margin drops wrong hits
    assert table.at[0.01, "false_hit_rate"] < table.at[0.005, "false_hit_rate"]
    # 0.0 would also serve the 0.002 bin, which no label covers.
    assert not table.at[0.0, "supported"] and table.at[0.005, "supported"] and table.at[0.1, "supported"]


def test_margin_table_empty_and_grid():
    empty = tuning.margin_table(_margins().iloc[0:0], 0, [0.005])
    assert empty.iloc[0]["est_hits"] == 0 and empty.iloc[0]["est_hit_rate"] is None
    grid = tuning.margin_grid(0.005)
    assert grid[0] == 0.0 and 0.005 in grid and grid == sorted(grid) and max(grid) <= 1.0
