"""dashboard.control.verdicts: users' and shadow checks' false-hit rates side by side, never pooled."""
import pandas as pd
import pytest

from dashboard import charts
from dashboard.control import sql_verdicts, verdicts


def shadow_frame():
    return pd.DataFrame([("a", "hit", 930, 3, 1), ("a", "miss", 850, 2, 2), ("a", "miss", 820, 1, 3),
                         ("b", "hit", 900, 4, 0)],
                        columns=["arm", "decision", "similarity_milli", "correct", "wrong"])


def test_user_vs_shadow_keeps_each_estimate_on_its_own_verdicts():
    users = pd.DataFrame([("a", "base", 8, 2), ("a", "canary", 0, 0), ("c", "base", 1, 1)],
                         columns=["arm", "variant", "correct", "wrong"])
    table = verdicts.user_vs_shadow(users, shadow_frame()).set_index("arm")
    assert table.loc["a", ["user_labelled", "shadow_labelled", "near_miss_labelled"]].tolist() == [10, 4, 8]
    assert table.loc["a", "user_false_hit_rate"] == pytest.approx(0.2)
    assert table.loc["a", "shadow_false_hit_rate"] == pytest.approx(0.25)
    assert table.loc["a", "near_miss_wrong_rate"] == pytest.approx(5 / 8)
    assert table.loc["b", "user_labelled"] == 0 and pd.isna(table.loc["b", "user_false_hit_rate"])
    assert table.loc["c", "shadow_labelled"] == 0 and pd.isna(table.loc["c", "shadow_false_hit_rate"])


def test_empty_inputs_give_an_empty_table_with_its_columns():
    assert verdicts.user_vs_shadow(None, None).empty
    assert list(verdicts.user_vs_shadow(None, None).columns)[:2] == ["arm", "user_labelled"]
    only_users = verdicts.user_vs_shadow(pd.DataFrame([("a", "base", 1, 1)],
                                                      columns=["arm", "variant", "correct", "wrong"]), None)
    assert only_users["shadow_labelled"].tolist() == [0]
    assert verdicts.near_miss_curve(None).empty


def test_near_miss_curve_and_its_chart():
    curve = verdicts.near_miss_curve(shadow_frame())
    assert curve["similarity"].tolist() == [0.85, 0.82]
    assert curve["wrong_rate"].tolist() == pytest.approx([0.5, 0.75])
    spec = charts.near_miss_curve(curve).to_dict()
    assert spec["encoding"]["x"]["field"] == "similarity" and spec["encoding"]["y"]["field"] == "wrong_rate"


def test_shadow_query_reads_only_shadow_verdicts():
    text = sql_verdicts.SHADOW_VERDICTS_SQL
    assert "FROM shadow_feedback_raw FINAL" in text and text.count("feedback_raw") == 1
    assert sql_verdicts.COLUMNS[text] == ["arm", "decision", "similarity_milli", "correct", "wrong"]


def judge_rows():
    columns = sql_verdicts.COLUMNS[sql_verdicts.JUDGE_VERSIONS_SQL]
    return pd.DataFrame([("a", "", 100, 40, 0, None, None, 8, 2, 0, 0),
                         ("b", "v2", 100, 50, 90, 4.0, 9.0, 19, 1, 6, 4),
                         ("b", "v3", 20, 5, 20, 3.0, 5.0, 0, 0, 0, 0)], columns=columns)


def test_judge_frame_rates_per_arm_and_version_each_on_its_own_verdicts():
    table = verdicts.judge_frame(judge_rows()).set_index(["arm", "judge"])
    assert table.loc[("a", "none"), "hit_rate"] == pytest.approx(0.4)
    assert table.loc[("b", "v2"), "user_false_hit_rate"] == pytest.approx(0.05)
    assert table.loc[("b", "v2"), "shadow_false_hit_rate"] == pytest.approx(0.4)
    assert pd.isna(table.loc[("b", "v3"), "user_false_hit_rate"])         # no verdicts: no rate, not 0
    spec = charts.judge_versions(table.reset_index()).to_dict()
    assert spec["encoding"]["y"]["field"] == "judge"


def test_no_judge_anywhere_is_an_empty_frame_the_page_explains():
    assert verdicts.judge_frame(judge_rows().iloc[:1]).empty
    assert verdicts.judge_frame(None).empty
    assert verdicts.judge_frame(judge_rows().iloc[:0]).empty


def source_rows():
    columns = sql_verdicts.COLUMNS[sql_verdicts.THRESHOLD_SOURCES_SQL]
    return pd.DataFrame([("b", "arm", 10, 5, 0, 0, 1, 1), ("b", "cluster", 60, 30, 9, 1, 18, 2),
                         ("b", "entry", 10, 8, 0, 0, 4, 0), ("b", "static", 20, 10, 3, 1, 0, 0),
                         ("c", "static", 5, 0, 0, 0, 0, 0)], columns=columns)


def test_threshold_source_frame_shares_and_rates_per_level_each_on_its_own_verdicts():
    table = verdicts.threshold_source_frame(source_rows())
    assert table["threshold_source"].tolist() == ["entry", "cluster", "arm", "static", "static"]  # specific first
    at = table.set_index(["arm", "threshold_source"])
    assert at["share"].loc["b"].tolist() == pytest.approx([0.1, 0.6, 0.1, 0.2])
    assert at.loc[("c", "static"), "share"] == 1.0 and at.loc[("c", "static"), "hit_rate"] == 0.0
    assert at.loc[("b", "cluster"), "hit_rate"] == pytest.approx(0.5)
    assert at.loc[("b", "cluster"), "user_false_hit_rate"] == pytest.approx(0.1)
    assert at.loc[("b", "cluster"), "shadow_false_hit_rate"] == pytest.approx(0.1)
    assert at.loc[("b", "static"), "user_false_hit_rate"] == pytest.approx(0.25)
    assert pd.isna(at.loc[("b", "static"), "shadow_false_hit_rate"])    # no shadow verdict: no rate, not 0
    assert at.loc[("b", "arm"), "shadow_labelled"] == 2 and pd.isna(at.loc[("b", "arm"), "user_false_hit_rate"])
    spec = charts.threshold_sources(table).to_dict()
    assert spec["encoding"]["x"]["field"] == "share" and spec["encoding"]["color"]["field"] == "threshold_source"


def test_no_error_bounded_arm_is_an_empty_frame():
    assert verdicts.threshold_source_frame(None).empty
    assert verdicts.threshold_source_frame(source_rows().iloc[:0]).empty
    text = sql_verdicts.THRESHOLD_SOURCES_SQL
    assert "threshold_source IS NOT NULL" in text and "FROM shadow_feedback_raw FINAL" in text
