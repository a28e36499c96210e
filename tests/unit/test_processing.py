"""dashboard.processing: the pandas glue between queries and pages."""
from datetime import datetime, timezone

import pandas as pd
import pytest

from cache_core.experiments import ArmConfig, ExperimentConfig
from dashboard import processing

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


def test_srm_uses_config_probabilities():
    skewed = SUMMARY.assign(requests=[1000, 1200])
    assert processing.srm_for(skewed, CONFIG).mismatch
    assert not processing.srm_for(SUMMARY, CONFIG).mismatch


def test_top_clusters_keeps_biggest():
    df = pd.DataFrame({"arm": ["a"] * 3, "intent_cluster": [1, 2, 3], "requests": [5, 50, 20]})
    assert processing.top_clusters(df, 2)["intent_cluster"].tolist() == [2, 3]
