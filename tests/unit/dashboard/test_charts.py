"""dashboard.charts: specs built from DataFrames, no Streamlit."""
import pandas as pd
import pytest

from dashboard import charts

SERIES = pd.DataFrame({
    "arm": ["control", "treatment", "control", "treatment"],
    "bucket": pd.to_datetime(["2026-12-01T10:00Z", "2026-12-01T10:00Z",
                              "2026-12-01T10:01Z", "2026-12-01T10:01Z"], utc=True),
    "requests": [100, 100, 120, 110],
    "hit_rate": [0.61, 0.72, 0.60, 0.74],
})
CHANGES = pd.DataFrame({
    "ts": pd.to_datetime(["2026-12-01T10:00:30Z"], utc=True), "arm": ["treatment"],
    "old_threshold": [0.8], "new_threshold": [0.75], "new_version": [2], "actor": ["alice"],
})


def _marks(spec: dict) -> list[str]:
    layers = spec.get("layer", [spec])
    return [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"] for layer in layers]


def test_hit_rate_over_time_lines_per_arm():
    spec = charts.hit_rate_over_time(SERIES).to_dict()
    assert _marks(spec) == ["line"]
    assert spec["encoding"]["color"]["field"] == "arm"
    assert spec["encoding"]["x"]["type"] == "temporal"


def _tick_times(axis: dict) -> list[pd.Timestamp]:
    assert all(v["utc"] for v in axis["values"])
    return [pd.Timestamp(year=v["year"], month=v["month"], day=v["date"], hour=v["hours"],
                         minute=v["minutes"], tz="UTC") for v in axis["values"]]


def test_time_axis_labels_each_minute_once_and_dates_beyond_a_day():
    axis = charts.hit_rate_over_time(SERIES).to_dict()["encoding"]["x"]["axis"]
    assert axis["format"] == "%H:%M" and "tickCount" not in axis
    assert _tick_times(axis) == list(pd.to_datetime(["2026-12-01T10:00Z", "2026-12-01T10:01Z"], utc=True))
    week = SERIES.assign(bucket=SERIES["bucket"] + pd.to_timedelta([0, 0, 3, 3], unit="D"))
    spec = charts.metric_over_time(week.assign(p95_ms=[40.0, 41.0, 39.0, 42.0]), "p95_ms").to_dict()
    assert spec["encoding"]["x"]["axis"]["format"] == "%b %d %H:%M"


@pytest.mark.parametrize("span,step", [
    ("7min", "1min"), ("9min", "2min"), ("1h", "10min"), ("3h", "30min"), ("20h", "3h"),
    ("3D", "12h"), ("20D", "3D"),
])
def test_time_axis_ticks_are_whole_distinct_steps_at_most_nine(span, step):
    start = pd.Timestamp("2026-12-01T10:00:20Z")  # off the minute: ticks round up to it
    times = pd.Series(pd.date_range(start, start + pd.Timedelta(span), periods=50))
    ticks = _tick_times(charts.time_axis(times).to_dict())
    assert 2 <= len(ticks) <= charts.MAX_TIME_TICKS + 1
    assert ticks[0] >= start and ticks[-1] <= times.iloc[-1]
    assert all(b - a == pd.Timedelta(step) for a, b in zip(ticks, ticks[1:]))
    assert len({t.strftime("%b %d %H:%M") for t in ticks}) == len(ticks)


def test_time_axis_of_one_bucket_or_none():
    one = charts.time_axis(pd.Series(pd.to_datetime(["2026-12-01T10:00Z"], utc=True))).to_dict()
    assert _tick_times(one) == [pd.Timestamp("2026-12-01T10:00Z")]
    assert charts.time_axis(pd.Series([], dtype="datetime64[ns, UTC]")).to_dict() == {"format": "%H:%M"}


def test_hit_rate_over_time_marks_threshold_changes():
    spec = charts.hit_rate_over_time(SERIES, CHANGES).to_dict()
    assert _marks(spec) == ["line", "rule"]
    rule = spec["layer"][1]
    assert rule["encoding"]["x"]["field"] == "ts"
    datasets = spec["datasets"].values()
    assert any(row.get("new_threshold") == 0.75 for rows in datasets for row in rows)


def test_breakdown_bars_group_by_arm():
    df = pd.DataFrame({"arm": ["control", "treatment"], "intent_cluster": [3, 3],
                       "requests": [10, 12], "hit_rate": [0.5, 0.75]})
    spec = charts.breakdown_bars(df, "intent_cluster").to_dict()
    assert _marks(spec) == ["bar"]
    assert spec["encoding"]["x"]["field"] == "intent_cluster"
    assert spec["encoding"]["xOffset"]["field"] == "arm"
    assert spec["encoding"]["y"]["axis"]["format"] == "%"
    assert [t["field"] for t in spec["encoding"]["tooltip"]] == ["intent_cluster", "arm", "hit_rate", "requests"]
    labelled = charts.breakdown_bars(df.assign(examples="How do I reset my PIN?"), "intent_cluster").to_dict()
    assert labelled["encoding"]["tooltip"][-1] == {"field": "examples", "title": "example queries", "type": "nominal"}


def test_breakdown_bars_absolute_values():
    df = pd.DataFrame({"arm": ["a"], "lifetime_bucket": ["fresh"], "requests": [1], "hits": [4]})
    spec = charts.breakdown_bars(df, "lifetime_bucket", value_col="hits", percent=False).to_dict()
    assert "format" not in spec["encoding"]["y"].get("axis", {})


def test_rate_with_interval_has_error_bars():
    df = pd.DataFrame({"arm": ["control"], "hit_rate": [0.6], "ci_low": [0.55], "ci_high": [0.65]})
    spec = charts.rate_with_interval(df).to_dict()
    assert _marks(spec) == ["rule", "point"]
    assert spec["layer"][0]["encoding"]["x2"]["field"] == "ci_high"


def test_whatif_curve_marks_candidate():
    curve = pd.DataFrame({"arm": ["a", "a"], "threshold": [0.8, 0.9], "est_hit_rate": [0.7, 0.5]})
    spec = charts.whatif_curve(curve, candidate=0.85).to_dict()
    assert _marks(spec) == ["line", "rule"]
    assert _marks(charts.whatif_curve(curve).to_dict()) == ["line"]


def test_waterfall_and_metric_and_tuning_charts():
    from dashboard.control import attribution
    df = pd.DataFrame([{"arm": a, "intent_cluster": c, "requests": 50, "hits": h}
                       for a, c, h in [("A", 1, 10), ("A", 2, 30), ("B", 1, 20), ("B", 2, 30)]])
    steps = attribution.waterfall_frame(attribution.decompose(df, "intent_cluster", "A", "B"))
    spec = charts.waterfall(steps).to_dict()
    assert spec["layer"][0]["mark"]["type"] == "bar"
    assert spec["layer"][0]["encoding"]["y2"]["field"] == "end"
    series = SERIES.assign(p95_ms=5.0)
    assert charts.metric_over_time(series, "p95_ms", CHANGES).to_dict()["layer"][1]["mark"]["type"] == "rule"
    with pytest.raises(ValueError, match="unknown metric"):
        charts.metric_over_time(series, "nope")
    cands = pd.DataFrame({"threshold": [0.8, 0.85], "est_hit_rate": [0.6, 0.5], "false_hit_upper": [0.08, 0.03]})
    tuned = charts.tuning_curve(cands, 0.05, current=0.85, recommended=0.8).to_dict()
    assert len(tuned["layer"]) == 4
