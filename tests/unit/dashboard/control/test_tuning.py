"""dashboard.control.tuning: guarded threshold recommendations and canary verdicts."""
import numpy as np
import pandas as pd
import pytest

from cache_core.experiments import ArmConfig, CanaryConfig, ExperimentConfig
from dashboard.control import tuning, tuning_multi, whatif
from dashboard.control.guardrails import Guardrails
from dashboard.control.canary import RolledBack, configs_by_version, evaluate_canary, last_failed_try, rolled_back_canaries
from dashboard.control.stats import ProportionStat
from dashboard.control.stats import upper_bound as stats_upper

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


G = Guardrails(target_false_hit_rate=0.05, min_decisions=100, min_labelled=30, max_step=0.03, cooldown_s=600)


def test_table_hit_rate_agrees_with_control_whatif():
    hist = _hist()
    table = whatif.threshold_table(hist, _labels(), [0.85]).iloc[0]
    replayed = whatif.whatif_hit_rate(hist, 0.85).iloc[0]
    assert table["est_hit_rate"] == pytest.approx(replayed["est_hit_rate"]) == pytest.approx(150 / 300)
    assert table["labelled"] == 750 and table["wrong"] == 15


def test_recommends_lowest_safe_threshold_within_max_step():
    rec = tuning.recommend("a", 0.88, _hist(), _labels(), G, now_ms=NOW)
    assert rec.action == "change"
    assert rec.recommended == pytest.approx(0.85)  # 0.03 below; 0.84 would add the 40%-wrong band
    assert rec.false_hit_upper <= 0.05
    assert rec.recommended_hit_rate > rec.current_hit_rate
    assert set(rec.candidates["threshold"]) >= {0.85, 0.88, 0.91}


def test_the_unsafe_band_is_avoided_even_when_allowed():
    wide = Guardrails(target_false_hit_rate=0.05, min_decisions=100, max_step=0.08)
    rec = tuning.recommend("a", 0.88, _hist(), _labels(), wide, now_ms=NOW)
    upper_at = rec.candidates.set_index("threshold")["false_hit_upper"]
    assert upper_at[0.82] > 0.05
    assert 0.82 < rec.recommended <= 0.85


def test_over_target_everywhere_raises_by_the_max_step():
    strict = Guardrails(target_false_hit_rate=0.01, min_decisions=100, max_step=0.03)
    rec = tuning.recommend("a", 0.88, _hist(), _labels(), strict, now_ms=NOW)
    assert (rec.action, rec.recommended) == ("change", pytest.approx(0.91))
    assert "above target" in rec.reason


def test_never_recommends_below_the_labelled_support():
    rec = tuning.recommend("a", 0.88, _hist(), _labels(lo=880), G, now_ms=NOW)
    assert rec.action == "hold" and "already the best" in rec.reason
    assert not rec.candidates.set_index("threshold").loc[0.875, "supported"]


def test_exploration_steps_below_the_labels_only_from_a_safe_best_threshold():
    # labels start at 0.82, all correct from 0.85: 0.85 is the best supported threshold and safe
    clean = _labels(lo=850, wrong_every=1000)
    rec = tuning.recommend("a", 0.85, _hist(), clean, G, now_ms=NOW)
    assert (rec.action, rec.recommended) == ("hold", pytest.approx(0.85))
    probe = tuning.exploration(rec)
    assert (probe.action, probe.recommended) == ("explore", pytest.approx(0.82))  # one max step, no labels there
    assert probe.recommended_hit_rate > rec.current_hit_rate and "canary" in probe.reason
    # once a canary has left labels down there, the same step is supported: no second exploration
    assert tuning.exploration(tuning.recommend("a", 0.85, _hist(), _labels(lo=820), G, now_ms=NOW)) is None


def test_exploration_after_a_rolled_back_canary_takes_a_smaller_step_or_none():
    held = tuning.recommend("a", 0.85, _hist(), _labels(lo=850, wrong_every=1000), G, now_ms=NOW)
    refuted = lambda threshold: RolledBack("a", NOW - 1000, threshold, None)
    smaller = tuning.exploration(held, refuted(0.82))
    assert (smaller.action, smaller.recommended) == ("explore", pytest.approx(0.825))  # the next grid value up
    assert "a smaller step: a canary at threshold 0.820 was rolled back" in smaller.reason
    blocked = tuning.exploration(held, refuted(0.845))  # nothing left between it and 0.85
    assert (blocked.action, blocked.recommended) == ("hold", pytest.approx(0.85))
    assert "not exploring lower: a canary at threshold 0.845" in blocked.reason
    # a canary that kept the arm's threshold (a multi floor-only one) does not bound it
    assert tuning.exploration(held, refuted(None)).recommended == pytest.approx(0.82)


def _audit(*steps):
    """configs_by_version and a change_history frame for ``steps`` of (version, {arm: ArmConfig})."""
    configs = {v: ExperimentConfig(experiment_id="e", salt="s", version=v, arms=list(arms.values()))
               for v, arms in steps}
    history = pd.DataFrame([{"ts": pd.Timestamp(v * 1000, unit="ms", tz="UTC"), "arm": "x", "old_version": v - 1,
                             "new_version": v, "config_json": configs[v].model_dump_json()} for v, _ in steps[1:]])
    return history.iloc[::-1], configs


def test_rolled_back_canaries_are_read_from_the_audit_and_promotions_are_not():
    a = ArmConfig(name="a", threshold=0.85)
    m = ArmConfig(name="m", similarity="multi", multi={"threshold": 0.5, "answer_margin": 0.01})
    canary = lambda arm, threshold, **kw: arm.model_copy(update={"canary": CanaryConfig(
        threshold=threshold, share=0.1, **kw)})
    history, configs = _audit(
        (1, {"a": a, "m": m}),
        (2, {"a": canary(a, 0.82), "m": m}),
        (3, {"a": canary(a, 0.80), "m": m}),                 # replaced by another canary: not an end
        (4, {"a": a, "m": m}),                               # rolled back: tried 0.80
        (5, {"a": canary(a, 0.83), "m": canary(m, m.threshold, score_floor=0.45)}),
        (6, {"a": a.model_copy(update={"threshold": 0.83}), "m": m}),  # a promoted; m's floor rolled back
    )
    found = rolled_back_canaries(history, configs)
    assert found == [RolledBack("m", 6000, None, 0.45), RolledBack("a", 4000, 0.80, None)]
    week = Guardrails(explore_memory_s=3600)
    assert last_failed_try(found, "a", "threshold", 6000, week).threshold == 0.80
    assert last_failed_try(found, "a", "threshold", 4000 + 3_601_000, week) is None  # forgotten
    assert last_failed_try(found, "a", "score_floor", 6000, week) is None
    assert last_failed_try(found, "m", "score_floor", 6000, week).score_floor == 0.45
    assert rolled_back_canaries(history.iloc[0:0], configs) == []


def test_exploration_never_for_changes_holds_without_support_clusters_or_empty_bands():
    assert tuning.exploration(tuning.recommend("a", 0.88, _hist(), _labels(), G, now_ms=NOW)) is None  # a change
    assert tuning.exploration(tuning.recommend("a", 0.85, _hist(per_bin=0), _labels(lo=850), G,
                                               now_ms=NOW)) is None  # too few decisions: hold, no value
    clean = _labels(lo=850, wrong_every=1000)
    cluster = tuning.recommend("a", 0.85, _hist(), clean, G, now_ms=NOW, cluster=1)
    assert cluster.action == "hold" and tuning.exploration(cluster) is None
    # nothing logged between 0.82 and 0.85: lowering would serve nothing more
    gap = _hist()
    gap = gap[(gap["similarity_milli"] < 800) | (gap["similarity_milli"] >= 850)]
    assert tuning.exploration(tuning.recommend("a", 0.85, gap, clean, G, now_ms=NOW)) is None


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
        Guardrails(target_false_hit_rate=0)


def test_recommend_all_per_cluster_uses_cluster_threshold_and_skips_canaries():
    config = ExperimentConfig(experiment_id="e", salt="s", arms=[
        ArmConfig(name="a", threshold=0.88, cluster_thresholds={2: 0.9}),
        ArmConfig(name="b", threshold=0.8, canary=CanaryConfig(threshold=0.78, share=0.1))])
    hist = pd.concat([_hist(cluster=1), _hist(cluster=2)])
    labels = pd.concat([_labels(cluster=1), _labels(cluster=2)])
    recs = tuning.recommend_all(config, hist, labels, G, now_ms=NOW, clusters=True)
    assert [(r.arm, r.cluster) for r in recs] == [("a", None), ("a", 1), ("a", 2)]
    assert recs[2].current == 0.9


def test_evaluate_canary():
    canary = CanaryConfig(threshold=0.8, share=0.1, target_false_hit_rate=0.05)
    bad = evaluate_canary(canary, ProportionStat(300, 45))
    good = evaluate_canary(canary, ProportionStat(2000, 20))
    early = evaluate_canary(canary, ProportionStat(20, 1))
    few_but_clean = evaluate_canary(canary, ProportionStat(10, 0), min_labelled=30)
    assert (bad.action, good.action, early.action, few_but_clean.action) == ("rollback", "promote", "continue", "continue")
    assert "above the target" in bad.reason and "labels" in few_but_clean.reason


def test_canary_test_waits_where_a_fixed_bound_rolled_back():
    """7.5% of 400 against 5%: the one-sided Clopper-Pearson lower bound (the removed
    ``bound`` method) is above target, but looked at on every run it rolls back a third of
    canaries that are exactly at target; the always-valid test waits."""
    canary = CanaryConfig(threshold=0.8, share=0.1, target_false_hit_rate=0.05)
    assert evaluate_canary(canary, ProportionStat(400, 30)).action == "continue"
    with pytest.raises(TypeError):
        evaluate_canary(canary, ProportionStat(400, 30), method="bound")


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
    at = lambda hist: whatif.threshold_table(hist, _labels(), [0.85, 0.95]).set_index("threshold")
    m, c = at(multi), at(cosine)
    # 150 bins of 10 at or above 0.85; in the 50 bins under 0.90 the mixed rule refuses 4 of 10.
    assert c.at[0.85, "est_hits"] == 1500 and m.at[0.85, "est_hits"] == 1500 - 200
    assert m.at[0.95, "est_hits"] == c.at[0.95, "est_hits"] == 500  # no refusals up there
    assert m.at[0.85, "est_hit_rate"] < c.at[0.85, "est_hit_rate"]
    replayed = whatif.whatif_hit_rate(multi, 0.85).iloc[0]
    assert replayed["est_hits"] == m.at[0.85, "est_hits"]  # the control panel's what-if agrees


def test_cosine_arm_unchanged_by_the_multi_columns():
    plain = _hist()
    with_zero_cols = plain.assign(multi_blocks=0, multi_min_threshold=np.nan)
    grid = [0.80, 0.85, 0.90]
    a = whatif.threshold_table(plain, _labels(), grid)
    b = whatif.threshold_table(with_zero_cols, _labels(), grid)
    pd.testing.assert_frame_equal(a.drop(columns="replayable"), b.drop(columns="replayable"))
    assert b["replayable"].all() and whatif.replay_floor(with_zero_cols) is None
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
    kept = whatif.drop_unreplayable(curve, hist)
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
    table = whatif.margin_table(_margins(), 200, [0.0, 0.005, 0.01, 0.05, 0.1]).set_index("answer_margin")
    # No-rival decisions are served at any margin; the others once their lead reaches it.
    assert table["est_hits"].to_dict() == {0.0: 90, 0.005: 80, 0.01: 60, 0.05: 50, 0.1: 40}
    assert table.at[0.005, "est_hit_rate"] == pytest.approx(80 / 200)
    assert (table.at[0.005, "labelled"], table.at[0.005, "wrong"]) == (80, 12)
    assert (table.at[0.01, "labelled"], table.at[0.01, "wrong"]) == (60, 3)  # a wider margin drops wrong hits
    assert table.at[0.01, "false_hit_rate"] < table.at[0.005, "false_hit_rate"]
    # 0.0 would also serve the 0.002 bin, which no label covers.
    assert not table.at[0.0, "supported"] and table.at[0.005, "supported"] and table.at[0.1, "supported"]


def test_margin_table_empty_and_grid():
    empty = whatif.margin_table(_margins().iloc[0:0], 0, [0.005])
    assert empty.iloc[0]["est_hits"] == 0 and empty.iloc[0]["est_hit_rate"] is None
    grid = whatif.margin_grid(0.005)
    assert grid[0] == 0.0 and 0.005 in grid and grid == sorted(grid) and max(grid) <= 1.0


# -- multi arms: score floor / answer margin recommendations ---------------------------

SCORE_COLS = ["config_version", "score_milli", "margin_milli", "decisions", "servable", "correct", "wrong"]


def _scores(rows, arm="m"):
    """queries.multi_score_histogram rows of one arm: (version, score bin, margin bin, decisions,
    servable, correct, wrong); None bins are NA."""
    df = pd.DataFrame(rows, columns=SCORE_COLS).assign(arm=arm)
    for col in ("score_milli", "margin_milli"):
        df[col] = pd.array(df[col], dtype="Int64")
    return df


def _band(version, lo, hi, *, margin=50, per_bin=10, labels=5, wrong=lambda b: 0):
    """per_bin servable decisions per score bin in [lo, hi), ``labels`` of them labelled, wrong(b) wrong."""
    return [(version, b, margin, per_bin, per_bin, labels - wrong(b), wrong(b)) for b in range(lo, hi)]


def test_multi_table_replays_floor_and_margin_together():
    hist = _scores([
        (1, None, None, 10, 0, 0, 0),  # nothing past the cosine gate: never served
        (1, 520, None, 5, 5, 3, 1),    # no rival answer: served at any margin
        (1, 520, 3, 4, 4, 0, 0),       # lead 0.003: refused by the logged margin 0.005
        (1, 560, 20, 6, 6, 4, 2),
        (1, 600, 10, 3, 2, 1, 0),      # one of three vetoed by a guard
    ])
    table = whatif.multi_table(hist, [0.50, 0.55, 0.56, 0.57], [0.0, 0.005, 0.015],
                               lowest_floor=0.50, lowest_margin=0.005).set_index(["score_floor", "answer_margin"])
    assert table["decisions"].eq(28).all()
    assert table.loc[(0.50, 0.005), ["est_hits", "labelled", "wrong"]].tolist() == [13, 11, 3]
    assert table.loc[(0.50, 0.0), "est_hits"] == 17 and not table.loc[(0.50, 0.0), "replayable"]
    assert table.loc[(0.55, 0.005), ["est_hits", "labelled", "wrong"]].tolist() == [8, 7, 2]
    assert table.loc[(0.56, 0.015), "est_hits"] == 6  # the 0.600 bin leads by only 0.010
    assert table.loc[(0.57, 0.005), "est_hits"] == 2
    assert table.loc[(0.55, 0.005), "est_hit_rate"] == pytest.approx(8 / 28)
    assert table.loc[(0.57, 0.015), "replayable"]


def test_multi_recommendation_raises_the_floor_past_a_wrong_band():
    # Logged at floor 0.50: 2 of 5 labels wrong in the 0.500-0.519 scores, clean above.
    hist = _scores(_band(1, 500, 600, wrong=lambda b: 2 if b < 520 else 0))
    rec = tuning_multi.recommend_multi("m", 0.50, 0.005, hist, {1: (0.50, 0.005)}, G, now_ms=NOW)
    assert rec.action == "change"
    # 0.515 (10 wrong of 425, 2.4%) passed the one-pass Clopper-Pearson bound; under the
    # time-uniform bound split over the pairs (issue 26 (c)) only the clean band above does.
    assert (rec.recommended_floor, rec.recommended_margin) == (pytest.approx(0.52), pytest.approx(0.005))
    table = rec.candidates.set_index(["score_floor", "answer_margin"])
    assert table.loc[(0.515, 0.005), "false_hit_upper"] > 0.05 >= rec.false_hit_upper
    assert round(table.loc[(0.515, 0.005), "false_hit_upper"], 5) == round(whatif.split_upper_bounds(
        [10] * len(table), [425] * len(table))[0], 5)
    assert rec.recommended_hit_rate < rec.current_hit_rate and rec.labelled == 80 * 5
    assert (rec.lowest_floor, rec.lowest_margin) == (0.50, 0.005)


def test_multi_recommendation_lowers_only_down_to_the_lowest_logged_floor():
    # Version 1 ran at floor 0.48 (labels reach down there), version 2 at 0.50: both clean.
    hist = _scores(_band(1, 480, 600) + _band(2, 500, 600))
    rules = {1: (0.48, 0.005), 2: (0.50, 0.005)}
    rec = tuning_multi.recommend_multi("m", 0.50, 0.005, hist, rules, G, now_ms=NOW)
    assert (rec.action, rec.recommended_floor, rec.recommended_margin) == ("change", pytest.approx(0.48),
                                                                          pytest.approx(0.005))
    assert not rec.candidates.set_index(["score_floor", "answer_margin"]).loc[(0.475, 0.005), "replayable"]
    # Only version 2 logged: 0.470-0.499 scores were refused (no labels), so nothing under 0.50.
    refused = [(2, b, 50, 10, 10, 0, 0) for b in range(470, 500)]
    only_v2 = _scores(refused + _band(2, 500, 600))
    rec = tuning_multi.recommend_multi("m", 0.50, 0.005, only_v2, rules, G, now_ms=NOW)
    table = rec.candidates.set_index(["score_floor", "answer_margin"])
    assert table.loc[(0.47, 0.005), "est_hits"] > table.loc[(0.50, 0.005), "est_hits"]  # tempting, not replayable
    assert not table.loc[(0.47, 0.005), "replayable"]
    assert rec.action == "hold" and "already the best" in rec.reason


def test_multi_exploration_tries_the_unreplayable_floor_below_a_safe_best_one():
    rules = {1: (0.48, 0.005), 2: (0.50, 0.005)}
    refused = [(2, b, 50, 10, 10, 0, 0) for b in range(470, 500)]
    held = tuning_multi.recommend_multi("m", 0.50, 0.005, _scores(refused + _band(2, 500, 600)), rules, G, now_ms=NOW)
    probe = tuning_multi.multi_exploration(held)
    assert (probe.action, probe.recommended_floor, probe.recommended_margin) == (
        "explore", pytest.approx(0.47), pytest.approx(0.005))
    assert probe.recommended_hit_rate > held.current_hit_rate and "on a canary" in probe.reason
    # after a canary at floor 0.47 was rolled back: a smaller step; at 0.495, none
    smaller = tuning_multi.multi_exploration(held, RolledBack("m", NOW, None, 0.47))
    assert (smaller.action, smaller.recommended_floor) == ("explore", pytest.approx(0.475))
    assert "a smaller step: a canary at score floor 0.470 was rolled back" in smaller.reason
    blocked = tuning_multi.multi_exploration(held, RolledBack("m", NOW, None, 0.495))
    assert blocked.action == "hold" and "not exploring lower" in blocked.reason
    # a change, or a hold where version 1's labels already cover the floors below: nothing to explore
    changed = tuning_multi.recommend_multi("m", 0.50, 0.005, _scores(_band(1, 480, 600) + _band(2, 500, 600)), rules, G,
                                     now_ms=NOW)
    assert changed.action == "change" and tuning_multi.multi_exploration(changed) is None
    cooling = tuning_multi.recommend_multi("m", 0.50, 0.005, _scores(refused + _band(2, 500, 600)), rules, G,
                                     now_ms=NOW, last_change_ms=NOW)
    assert cooling.action == "hold" and tuning_multi.multi_exploration(cooling) is None


def test_logged_rules_take_the_stricter_of_arm_and_canary():
    arm = ArmConfig(name="m", similarity="multi", multi={"threshold": 0.5, "answer_margin": 0.01})
    config = lambda canary, v: ExperimentConfig(experiment_id="e", salt="s", version=v, arms=[
        arm.model_copy(update={"canary": canary})])
    lower = CanaryConfig(threshold=0.82, share=0.1, score_floor=0.45)
    wider = CanaryConfig(threshold=0.82, share=0.1, answer_margin=0.03)
    rules = tuning_multi.logged_rules({1: config(None, 1), 2: config(lower, 2), 3: config(wider, 3)}, "m")
    # a lower canary floor serves a superset, so the arm's floor still bounds the replay; a wider
    # canary margin refused some of what the arm's margin served, so it bounds it instead
    assert rules == {1: (0.5, 0.01), 2: (0.5, 0.01), 3: (0.5, 0.03)}


def test_multi_recommendation_widens_the_margin_against_near_ties():
    # Decisions leading their rival by 0.010 are half wrong; clear leads and no-rival ones are clean.
    hist = _scores(_band(1, 600, 700, margin=10, wrong=lambda b: 2 if b % 2 else 3)
                   + _band(1, 600, 700, margin=None) + _band(1, 600, 700, margin=40))
    rec = tuning_multi.recommend_multi("m", 0.55, 0.005, hist, {1: (0.55, 0.005)}, G, now_ms=NOW)
    assert rec.action == "change"
    # 0.015 drops the 0.010 leads; wider margins serve no fewer, but move further.
    assert (rec.recommended_floor, rec.recommended_margin) == (pytest.approx(0.55), pytest.approx(0.015))
    assert rec.candidates.set_index(["score_floor", "answer_margin"]).loc[(0.55, 0.035), "est_hits"] == 2000


def test_multi_recommendation_guardrails_hold():
    hist = _scores(_band(1, 500, 600, wrong=lambda b: 2 if b < 520 else 0))
    rules = {1: (0.50, 0.005)}
    few = tuning_multi.recommend_multi("m", 0.50, 0.005, _scores(_band(1, 500, 505)), rules, G, now_ms=NOW)
    assert few.action == "hold" and "50 logged decisions" in few.reason
    cooling = tuning_multi.recommend_multi("m", 0.50, 0.005, hist, rules, G, now_ms=NOW, last_change_ms=NOW - 60_000)
    assert cooling.action == "hold" and "cool-down" in cooling.reason and cooling.recommended_floor is None
    unknown = tuning_multi.recommend_multi("m", 0.50, 0.005, hist, {}, G, now_ms=NOW)
    assert unknown.action == "hold" and "config version(s) [1]" in unknown.reason
    unlabelled = _scores(_band(1, 500, 600, labels=0))
    none = tuning_multi.recommend_multi("m", 0.50, 0.005, unlabelled, rules, G, now_ms=NOW)
    assert none.action == "hold" and "labelled hits" in none.reason
    cosine_only = _scores([(1, None, None, 500, 0, 0, 0)])
    assert "no logged mixed scores" in tuning_multi.recommend_multi("m", 0.50, 0.005, cosine_only, rules, G,
                                                              now_ms=NOW).reason


def test_multi_recommendation_over_target_everywhere_raises_the_floor_by_the_max_step():
    hist = _scores(_band(1, 500, 600, wrong=lambda b: 1))  # 20% wrong at every score
    rec = tuning_multi.recommend_multi("m", 0.50, 0.005, hist, {1: (0.50, 0.005)}, G, now_ms=NOW)
    assert (rec.action, rec.recommended_floor, rec.recommended_margin) == ("change", pytest.approx(0.53),
                                                                          pytest.approx(0.005))
    assert "above target" in rec.reason


def test_configs_by_version_and_logged_rules():
    def config(version, floor, similarity="multi"):
        return ExperimentConfig(experiment_id="e", salt="s", version=version, arms=[
            ArmConfig(name="m", similarity=similarity, multi={"threshold": floor, "answer_margin": 0.01}),
            ArmConfig(name="c")])
    history = pd.DataFrame({"config_json": [config(3, 0.6).model_dump_json(), "", config(2, 0.5, "cosine").model_dump_json()]})
    known = configs_by_version(history, config(1, 0.4), None, config(4, 0.7))
    assert sorted(known) == [1, 2, 3, 4]
    assert tuning_multi.logged_rules(known, "m") == {1: (0.4, 0.01), 3: (0.6, 0.01), 4: (0.7, 0.01)}  # v2: cosine
    assert tuning_multi.logged_rules(known, "c") == {}
    assert configs_by_version(pd.DataFrame(columns=["config_json"])) == {}


def test_recommend_multi_all_skips_cosine_arms_and_canaries():
    config = ExperimentConfig(experiment_id="e", salt="s", arms=[
        ArmConfig(name="m", similarity="multi", multi={"threshold": 0.50, "answer_margin": 0.005}),
        ArmConfig(name="k", similarity="multi", canary=CanaryConfig(threshold=0.9, share=0.1)),
        ArmConfig(name="c")])
    hist = pd.concat([_scores(_band(1, 500, 600, wrong=lambda b: 2 if b < 520 else 0)),
                      _scores(_band(1, 500, 600), arm="k")])
    recs = tuning_multi.recommend_multi_all(config, hist, {1: config}, G, now_ms=NOW)
    assert [r.arm for r in recs] == ["m"]
    assert recs[0].recommended_floor == pytest.approx(0.52)  # the split time-uniform bound


# -- re-runs: a time-uniform bound split over the candidates; labels at or below each -----

def test_the_bound_is_time_uniform_and_split_over_the_candidates():
    from dashboard.control.target_test import upper_confidence_bound

    labels = pd.DataFrame({"arm": "a", "intent_cluster": 1, "similarity_milli": [870], "correct": [155], "wrong": [1]})
    one = whatif.threshold_table(_hist(), labels, [0.87]).iloc[0]
    thirteen = whatif.threshold_table(_hist(), labels, np.round(np.arange(0.87, 0.9301, 0.005), 3)).iloc[0]
    assert round(one["false_hit_upper"], 5) == round(upper_confidence_bound(ProportionStat(156, 1), 0.05), 5)
    assert round(thirteen["false_hit_upper"], 5) == 0.07235  # 1 of 156 at alpha 0.05 / 13 (Clopper-Pearson: 0.030)
    assert thirteen["false_hit_upper"] > one["false_hit_upper"] > stats_upper(ProportionStat(156, 1))


def test_labels_logged_at_a_higher_threshold_do_not_vouch_for_a_lower_one():
    """A window at 0.90 served only hits >= 0.90 (all correct here); a window at 0.85 served the
    0.85-0.90 band too (40% wrong there). Pooled, 0.85 looked safe; per window it does not."""
    band = pd.DataFrame({"arm": "a", "intent_cluster": 1, "similarity_milli": np.arange(850, 900),
                         "threshold_milli": 850, "correct": 3, "wrong": 2})
    safe_then = pd.DataFrame({"arm": "a", "intent_cluster": 1, "similarity_milli": np.arange(900, 1000),
                              "threshold_milli": 900, "correct": 50, "wrong": 0})
    safe_now = safe_then.assign(threshold_milli=850, correct=5)
    labels = pd.concat([band, safe_then, safe_now])
    table = whatif.threshold_table(_hist(), labels, [0.85, 0.90]).set_index("threshold")
    assert table.at[0.85, "labelled"] == 250 + 500 and table.at[0.85, "wrong"] == 100  # the 0.90 window left out
    assert table.at[0.90, "labelled"] == 5000 + 500
    pooled = whatif.threshold_table(_hist(), labels.drop(columns="threshold_milli"), [0.85]).iloc[0]
    assert pooled["false_hit_rate"] < 0.02 < table.at[0.85, "false_hit_rate"]


def test_multi_and_margin_tables_use_the_split_time_uniform_bound():
    """Issue 26 (c): the multi arms' tables drive auto-tune's floor / margin choice on every
    run, so their bound is the time-uniform one split over the candidates (as the threshold
    table's), not a one-pass Clopper-Pearson bound (1 of 156: 3.0%)."""
    assert [None if b is None else round(b, 5) for b in whatif.split_upper_bounds([0, 1, 3, 0], [0, 156, 100, 400])] \
        == [None, 0.06209, 0.12632, 0.02042]
    assert round(whatif.split_upper_bounds([1], [156])[0], 5) == 0.04882 > round(stats_upper(ProportionStat(156, 1)), 5)
    table = whatif.margin_table(_margins(), 200, [0.0, 0.005, 0.01, 0.05, 0.1]).set_index("answer_margin")
    assert table.at[0.01, "false_hit_upper"] == pytest.approx(whatif.split_upper_bounds([3] * 5, [60] * 5)[0])
    hist = _scores(_band(1, 500, 520))
    pairs = whatif.multi_table(hist, [0.50, 0.51], [0.0, 0.005, 0.01], lowest_floor=0.5, lowest_margin=0.005)
    assert len(pairs) == 6
    assert pairs.iloc[0]["false_hit_upper"] == pytest.approx(whatif.split_upper_bounds([0] * 6, [100] * 6)[0])


def test_vectorised_upper_bounds_match_the_scalar_one():
    from dashboard.control.target_test import upper_confidence_bound, upper_confidence_bounds
    wrong, n = [0, 1, 5, 80, 0, 3, 0], [10, 156, 100, 100, 1, 3000, 0]
    many = upper_confidence_bounds(wrong, n, 0.05 / 13)
    for k, m, b in zip(wrong, n, many):
        one = upper_confidence_bound(ProportionStat(m, k), 0.05 / 13)
        assert (one is None and np.isnan(b)) if m == 0 else one == b
    assert round(float(many[1]), 5) == 0.07235 and many[3] == 1.0
