"""dashboard.control.processing: the pandas glue between queries and pages."""
from datetime import datetime, timezone

import pandas as pd
import pytest

from cache_core.experiments import ArmConfig, ExperimentConfig
from dashboard.control import processing

SUMMARY = pd.DataFrame({
    "arm": ["control", "treatment"], "requests": [1000, 1040], "hits": [611, 752],
    "latency_mean_ms": [5.0, 4.0], "similarity_mean": [0.8, 0.85], "guard_blocks": [1, 2],
})
CONFIG = ExperimentConfig(experiment_id="e", salt="s", traffic_share=1.0,
                          arms=[ArmConfig(name="control"), ArmConfig(name="treatment")])


def test_time_window_and_unknown_label():
    now = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
    start, end = processing.time_window("Last hour", now)
    assert (now - start).total_seconds() == 3600 and end > now
    with pytest.raises(ValueError, match="unknown time range"):
        processing.time_window("forever", now)


def test_bucket_seconds_never_below_window():
    start = datetime(2026, 12, 1, tzinfo=timezone.utc)
    assert processing.bucket_seconds(start, start.replace(minute=15), window_s=60) == 60
    assert processing.bucket_seconds(start, start.replace(day=2), window_s=60) == 1440


def test_baseline_prefers_control_then_config_order():
    assert processing.baseline_arm(["treatment", "control"], None) == "control"
    cfg = ExperimentConfig(experiment_id="e", salt="s", arms=[ArmConfig(name="b"), ArmConfig(name="a")])
    assert processing.baseline_arm(["a", "b"], cfg) == "b"
    assert processing.baseline_arm(["holdout"], None) is None


def test_overview_and_comparison():
    latency = pd.DataFrame({"arm": ["control"], "p50_ms": [3.0], "p95_ms": [9.0]})
    table = processing.overview_frame(SUMMARY, latency, cost_per_call_usd=0.01).set_index("arm")
    assert table.at["control", "ci_low"] < 0.611 < table.at["control", "ci_high"]
    assert table.at["control", "p95_ms"] == 9.0 and pd.isna(table.at["treatment", "p95_ms"])
    assert table.at["treatment", "savings_usd"] == pytest.approx(7.52)
    cmp = processing.comparison_frame(SUMMARY, "control")
    assert cmp["arm"].tolist() == ["treatment"] and cmp.at[0, "status"] == "ok"
    assert cmp.at[0, "p"] == "<0.0001"


def test_format_p_value():
    assert processing.format_p_value(None) == "—"
    assert processing.format_p_value(0.04213) == "0.0421"


def _units(users: list[int]) -> pd.DataFrame:
    return pd.DataFrame({"arm": ["control", "treatment"], "units": users, "sum_x": [10 * u for u in users],
                         "sum_y": [3 * u for u in users], "sum_x2": [200 * u for u in users],
                         "sum_y2": [20 * u for u in users], "sum_xy": [50 * u for u in users]})


def test_srm_counts_users_with_the_config_probabilities():
    assert processing.srm_for(_units([1000, 1200]), CONFIG).mismatch
    assert not processing.srm_for(_units([1000, 1040]), CONFIG).mismatch
    # requests are not what SRM checks: a heavy user moves them, not the split
    assert processing.srm_for(_units([1000, 1040]), CONFIG).observed == {"control": 1000, "treatment": 1040}


def test_per_user_intervals_and_comparison_say_so():
    latency = pd.DataFrame({"arm": ["control"], "p50_ms": [3.0], "p95_ms": [9.0]})
    units = _units([1000, 1040]).assign(sum_y=[3000.0, 3900.0])
    table = processing.overview_frame(SUMMARY, latency, units=units).set_index("arm")
    assert table.at["control", "basis"] == processing.PER_USER and table.at["control", "users"] == 1000
    assert table.at["control", "hit_rate"] == pytest.approx(0.611)  # the request-level description stays
    per_request = processing.overview_frame(SUMMARY, latency).set_index("arm")
    assert per_request.at["control", "basis"] == processing.PER_REQUEST
    # the interval is that of the per-user data (3 hits of 10 requests per user)
    assert table.at["control", "ci_low"] < 0.3 < table.at["control", "ci_high"]
    cmp = processing.comparison_frame(SUMMARY, "control", units=units).set_index("arm")
    assert cmp.at["treatment", "basis"] == processing.PER_USER
    assert cmp.at["treatment", "diff"] == pytest.approx(3900 / 10400 - 0.3)


def test_unit_paths_accumulate_per_bucket():
    path = pd.DataFrame({"arm": ["control", "treatment", "control"],
                         "bucket": pd.to_datetime([1, 1, 2], unit="m", utc=True),
                         "units": [2, 3, 1], "sum_x": [4, 6, 3], "sum_y": [1, 2, 1], "sum_x2": [8, 12, 9],
                         "sum_y2": [1, 2, 1], "sum_xy": [2, 4, 3]})
    paths = processing.cumulative_unit_paths(path, ["control", "treatment", "holdout"])
    assert [s.n for s in paths["control"]] == [2, 3] and paths["control"][-1].sum_x2 == 17
    assert [s.n for s in paths["treatment"]] == [3, 3]  # no traffic in bucket 2: totals repeat
    assert paths["holdout"] == []


def test_top_clusters_keeps_biggest():
    df = pd.DataFrame({"arm": ["a"] * 3, "intent_cluster": [1, 2, 3], "requests": [5, 50, 20]})
    assert processing.top_clusters(df, 2)["intent_cluster"].tolist() == [2, 3]


def test_overview_costs_and_false_hits():
    latency = pd.DataFrame({"arm": ["control", "treatment"], "p50_ms": [1.0, 2.0], "p95_ms": [3.0, 4.0]})
    labels = pd.DataFrame({"arm": ["control", "treatment", "treatment"], "variant": ["base", "base", "canary"],
                           "correct": [90, 45, 40], "wrong": [10, 5, 10]})
    table = processing.overview_frame(SUMMARY, latency, 0.01, tokens_per_call=100, embedding_cost_usd=0.001,
                                      false_hits=labels).set_index("arm")
    row = table.loc["treatment"]
    assert row["model_calls"] == row["requests"] - row["hits"]
    assert row["tokens_saved"] == row["hits"] * 100
    assert row["net_savings_usd"] == pytest.approx(row["hits"] * 0.01 - row["requests"] * 0.001)
    assert row["false_hit_rate"] == pytest.approx(15 / 100) and row["labelled"] == 100
    assert row["fh_low"] < 0.15 < row["fh_high"]
    assert table["traffic_share"].sum() == pytest.approx(1.0)


def test_comparison_with_bayes_and_sequential():
    series = pd.DataFrame({"arm": ["control", "treatment"] * 3,
                           "bucket": pd.to_datetime([1, 1, 2, 2, 3, 3], unit="m", utc=True),
                           "requests": [400] * 6, "hits": [200, 260] * 3})
    summary = series.groupby("arm", as_index=False)[["requests", "hits"]].sum()
    cmp = processing.comparison_frame(summary, "control", series).set_index("arm")
    assert cmp.at["treatment", "prob_beat"] > 0.999
    assert cmp.at["treatment", "seq_verdict"] == "significant"
    assert cmp.at["treatment", "seq_p_value"] >= cmp.at["treatment", "p_value"]


def test_cluster_comparison_holm():
    rows = []
    for c in range(10):
        rows += [{"arm": "control", "intent_cluster": c, "requests": 200, "hits": 100},
                 {"arm": "treatment", "intent_cluster": c, "requests": 200, "hits": 100 + (60 if c == 0 else 22)}]
    df = processing.cluster_comparison(pd.DataFrame(rows), "control", "treatment").set_index("intent_cluster")
    assert bool(df.at[0, "significant"])
    assert df.at[1, "p_value"] < 0.05 and not bool(df.at[1, "significant"])  # noise across 10 clusters
    assert (df["p_holm"] >= df["p_value"]).all()


def test_cluster_choices_offer_the_arms_busiest_then_the_overridden():
    df = pd.DataFrame({"arm": ["a", "a", "a", "b"], "intent_cluster": [1_800_000_123, 7, 7, 9],
                       "requests": [5, 3, 4, 100]})
    choices = processing.cluster_choices(df, "a", overridden={42: 0.9, 7: 0.8})
    assert list(choices) == [7, 1_800_000_123, 42]  # by volume on arm a; arm b's cluster 9 not offered
    assert choices[7] == "7 (7 requests)" and "overridden" in choices[42]
    assert processing.cluster_choices(df.iloc[0:0], "a") == {}


EXAMPLES = pd.DataFrame({"intent_cluster": [7, 42, 5],
                         "examples": [["How do I reset my PIN?", "forgot PIN"], ["x " * 80], []],
                         "texts": [9, 1, 0]})


def test_cluster_choices_say_what_each_cluster_is_about():
    df = pd.DataFrame({"arm": ["a", "a"], "intent_cluster": [7, 1_800_000_123], "requests": [5, 3]})
    labels = processing.cluster_labels(EXAMPLES, width=20)
    assert labels[7] == "“How do I reset my…”"
    assert labels[42].endswith("x…”") and len(labels[42]) <= 22 and 5 not in labels
    choices = processing.cluster_choices(df, "a", overridden={42: 0.9}, labels=labels)
    assert choices[7] == "7 “How do I reset my…” (5 requests)"
    assert choices[1_800_000_123] == "1800000123 (3 requests)"  # no text emitted for it
    assert choices[42].startswith("42 “x x") and "overridden" in choices[42]
    assert processing.cluster_labels(EXAMPLES.iloc[0:0]) == {} == processing.cluster_labels(None)


def test_with_cluster_examples_joins_each_clusters_texts():
    frame = pd.DataFrame({"intent_cluster": [7, 8, 7], "requests": [1, 2, 3]})
    out = processing.with_cluster_examples(frame, EXAMPLES)
    assert out["examples"].tolist() == ["How do I reset my PIN? · forgot PIN", "", "How do I reset my PIN? · forgot PIN"]
    assert out["requests"].tolist() == [1, 2, 3]
    assert processing.with_cluster_examples(frame, None)["examples"].tolist() == ["", "", ""]
    assert list(processing.with_cluster_examples(frame.iloc[0:0], EXAMPLES).columns) == [
        "intent_cluster", "requests", "examples"]


def test_shorten_keeps_one_line_within_width():
    assert processing.shorten("  a\n b  ", 10) == "a b"
    assert processing.shorten("abcdefghijk", 5) == "abcd…"
    assert processing.shorten("reset my card PIN", 12) == "reset my…"
