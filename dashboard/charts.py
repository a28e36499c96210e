"""Altair charts for the dashboard: a DataFrame and column names in, a chart out.

No Streamlit here, so every chart can be built and inspected (``chart.to_dict()``)
in a plain unit test.
"""
from __future__ import annotations

import altair as alt
import pandas as pd

RATE_AXIS = alt.Axis(format="%")
DAY = pd.Timedelta(days=1)


# Tick steps in minutes, from a minute to a day: the first giving at most MAX_TIME_TICKS.
TICK_STEPS_MIN = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440)
MAX_TIME_TICKS = 8


def _utc_datetime(t: pd.Timestamp) -> alt.DateTime:
    return alt.DateTime(year=t.year, month=t.month, date=t.day, hours=t.hour, minutes=t.minute, utc=True)


def time_axis(times: pd.Series) -> alt.Axis:
    """Ticks on whole minutes (or hours, or days), each label once. Vega's own ticks fall
    every 30 s on a short range, printing each ``%H:%M`` twice, and neither ``tickMinStep``
    nor an interval ``tickCount`` binds them on Streamlit's Vega (the latter breaks the
    chart), so the tick values are given (as Vega-Lite DateTimes: plain epoch numbers draw
    no label on a UTC scale).
    The date is shown once the data spans more than a day."""
    times = pd.to_datetime(times, utc=True, errors="coerce").dropna()
    if times.empty:
        return alt.Axis(format="%H:%M")
    first, last = times.min(), times.max()
    minutes = (last - first).total_seconds() / 60
    step_min = next((s for s in TICK_STEPS_MIN if s * MAX_TIME_TICKS >= minutes),
                    1440 * -(-int(minutes // 1440 + 1) // MAX_TIME_TICKS))
    step = pd.Timedelta(minutes=step_min)
    ticks = pd.date_range(first.ceil(step), last, freq=step) if step_min <= 1440 else \
        pd.date_range(first.ceil("D"), last, freq=step)
    values = [_utc_datetime(t) for t in (ticks if len(ticks) else [first])]
    return alt.Axis(format="%b %d %H:%M" if last - first > DAY else "%H:%M", values=values)


def hit_rate_over_time(df: pd.DataFrame, changes: pd.DataFrame | None = None, *,
                       time_col: str = "bucket", rate_col: str = "hit_rate",
                       arm_col: str = "arm", change_time_col: str = "ts") -> alt.TopLevelMixin:
    """Hit rate per arm over time; each threshold change is a dashed vertical rule."""
    lines = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X(f"{time_col}:T", title="window start (UTC)", scale=alt.Scale(type="utc"),
                axis=time_axis(df[time_col])),
        y=alt.Y(f"{rate_col}:Q", title="hit rate", axis=RATE_AXIS),
        color=alt.Color(f"{arm_col}:N", title="arm"),
        tooltip=[alt.Tooltip(f"{time_col}:T"), alt.Tooltip(f"{arm_col}:N"),
                 alt.Tooltip(f"{rate_col}:Q", format=".1%"), alt.Tooltip("requests:Q")],
    )
    if changes is None or changes.empty:
        return lines.properties(height=320)
    rules = alt.Chart(changes).mark_rule(strokeDash=[4, 4], color="gray").encode(
        x=alt.X(f"{change_time_col}:T", scale=alt.Scale(type="utc")),
        tooltip=[alt.Tooltip(f"{change_time_col}:T", title="changed at"),
                 alt.Tooltip("arm:N"), alt.Tooltip("old_threshold:Q", format=".3f"),
                 alt.Tooltip("new_threshold:Q", format=".3f"),
                 alt.Tooltip("new_version:Q", title="version"), alt.Tooltip("actor:N")],
    )
    return alt.layer(lines, rules).properties(height=320)


def breakdown_bars(df: pd.DataFrame, category_col: str, *, value_col: str = "hit_rate",
                   arm_col: str = "arm", value_title: str = "hit rate",
                   percent: bool = True) -> alt.Chart:
    """Grouped bars: one group per category, one bar per arm (an ``examples`` column, as
    ``processing.with_cluster_examples`` adds, goes into the tooltip)."""
    axis = RATE_AXIS if percent else alt.Axis()
    tooltip_format = ".1%" if percent else ",.2f"
    tooltip = [alt.Tooltip(f"{category_col}:N"), alt.Tooltip(f"{arm_col}:N"),
               alt.Tooltip(f"{value_col}:Q", format=tooltip_format), alt.Tooltip("requests:Q")]
    if "examples" in df.columns:
        tooltip.append(alt.Tooltip("examples:N", title="example queries"))
    return alt.Chart(df).mark_bar().encode(
        x=alt.X(f"{category_col}:N", title=category_col.replace("_", " "), sort=None,
                axis=alt.Axis(labelAngle=0)),
        xOffset=alt.XOffset(f"{arm_col}:N"),
        y=alt.Y(f"{value_col}:Q", title=value_title, axis=axis),
        color=alt.Color(f"{arm_col}:N", title="arm"),
        tooltip=tooltip,
    ).properties(height=280)


def tier_hit_rates(df: pd.DataFrame, *, arm_col: str = "arm", tier_col: str = "tier",
                   rate_col: str = "hit_rate") -> alt.Chart:
    """One stacked bar per arm: its hit rate split by the store tier that served the hits
    (the stack adds up to the arm's hit rate)."""
    return alt.Chart(df).mark_bar().encode(
        x=alt.X(f"{arm_col}:N", title="arm", axis=alt.Axis(labelAngle=0)),
        y=alt.Y(f"{rate_col}:Q", title="hit rate", axis=RATE_AXIS, stack="zero"),
        color=alt.Color(f"{tier_col}:N", title="tier", sort=["memory", "disk"]),
        order=alt.Order(f"{tier_col}:N", sort="descending"),
        tooltip=[alt.Tooltip(f"{arm_col}:N"), alt.Tooltip(f"{tier_col}:N"),
                 alt.Tooltip(f"{rate_col}:Q", format=".1%"), alt.Tooltip("hits:Q"), alt.Tooltip("requests:Q")],
    ).properties(height=240)


def rate_with_interval(df: pd.DataFrame, *, arm_col: str = "arm", rate_col: str = "hit_rate",
                       low_col: str = "ci_low", high_col: str = "ci_high") -> alt.LayerChart:
    """Per-arm rate as a point with its confidence interval as an error bar."""
    base = alt.Chart(df).encode(y=alt.Y(f"{arm_col}:N", title="arm"))
    points = base.mark_point(filled=True, size=80).encode(
        x=alt.X(f"{rate_col}:Q", title="hit rate (95% CI)", axis=RATE_AXIS),
        color=alt.Color(f"{arm_col}:N", legend=None),
    )
    bars = base.mark_rule().encode(x=alt.X(f"{low_col}:Q"), x2=alt.X2(f"{high_col}:Q"),
                                   color=alt.Color(f"{arm_col}:N", legend=None))
    return alt.layer(bars, points).properties(height=alt.Step(36))


def whatif_curve(curve: pd.DataFrame, candidate: float | None = None, *,
                 threshold_col: str = "threshold", rate_col: str = "est_hit_rate",
                 arm_col: str = "arm") -> alt.TopLevelMixin:
    """Estimated hit rate per arm as a function of the threshold, the candidate marked."""
    lines = alt.Chart(curve).mark_line().encode(
        x=alt.X(f"{threshold_col}:Q", title="threshold", scale=alt.Scale(zero=False)),
        y=alt.Y(f"{rate_col}:Q", title="estimated hit rate", axis=RATE_AXIS),
        color=alt.Color(f"{arm_col}:N", title="arm"),
        tooltip=[alt.Tooltip(f"{arm_col}:N"), alt.Tooltip(f"{threshold_col}:Q", format=".3f"),
                 alt.Tooltip(f"{rate_col}:Q", format=".1%")],
    )
    if candidate is None:
        return lines.properties(height=260)
    rule = alt.Chart(pd.DataFrame({threshold_col: [candidate]})).mark_rule(
        color="red", strokeDash=[4, 4]).encode(x=f"{threshold_col}:Q")
    return alt.layer(lines, rule).properties(height=260)


METRICS: dict[str, tuple[str, str]] = {
    "hit_rate": ("hit rate", ".1%"),
    "false_hit_rate": ("false-hit rate (labelled hits)", ".1%"),
    "requests": ("requests", ",.0f"),
    "p50_ms": ("latency p50 (ms)", ".1f"),
    "p95_ms": ("latency p95 (ms)", ".1f"),
}
"""Time-series metrics: column -> (axis title, number format)."""


def metric_over_time(df: pd.DataFrame, metric: str, changes: pd.DataFrame | None = None, *,
                     time_col: str = "bucket", arm_col: str = "arm") -> alt.TopLevelMixin:
    """One metric per arm over time, threshold changes as dashed rules (see METRICS)."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {list(METRICS)}")
    if metric == "hit_rate":
        return hit_rate_over_time(df, changes, time_col=time_col, arm_col=arm_col)
    title, fmt = METRICS[metric]
    axis = RATE_AXIS if fmt.endswith("%") else alt.Axis()
    lines = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X(f"{time_col}:T", title="window start (UTC)", scale=alt.Scale(type="utc"),
                axis=time_axis(df[time_col])),
        y=alt.Y(f"{metric}:Q", title=title, axis=axis),
        color=alt.Color(f"{arm_col}:N", title="arm"),
        tooltip=[alt.Tooltip(f"{time_col}:T"), alt.Tooltip(f"{arm_col}:N"), alt.Tooltip(f"{metric}:Q", format=fmt)],
    )
    if changes is None or changes.empty:
        return lines.properties(height=320)
    rules = alt.Chart(changes).mark_rule(strokeDash=[4, 4], color="gray").encode(
        x=alt.X("ts:T", scale=alt.Scale(type="utc")),
        tooltip=[alt.Tooltip("ts:T", title="changed at"), alt.Tooltip("arm:N"),
                 alt.Tooltip("new_threshold:Q", format=".3f"), alt.Tooltip("new_version:Q", title="version")])
    return alt.layer(lines, rules).properties(height=320)


def waterfall(steps: pd.DataFrame) -> alt.LayerChart:
    """Waterfall of ``attribution.waterfall_frame``: totals as full bars, effects as floating steps."""
    color = alt.Color("kind:N", title="", scale=alt.Scale(domain=["total", "mix", "rate"],
                                                          range=["#4c78a8", "#f58518", "#54a24b"]))
    x = alt.X("step:N", sort=alt.EncodingSortField("order"), title=None, axis=alt.Axis(labelAngle=-30, labelLimit=220))
    bars = alt.Chart(steps).mark_bar(size=36).encode(
        x=x, y=alt.Y("start:Q", title="hit rate", axis=RATE_AXIS), y2="end:Q", color=color,
        tooltip=[alt.Tooltip("step:N"), alt.Tooltip("value:Q", format="+.2%", title="effect / rate")])
    labels = alt.Chart(steps).mark_text(dy=-8).encode(
        x=x, y=alt.Y("label_y:Q"), text=alt.Text("value:Q", format="+.1%"))
    return alt.layer(bars, labels.transform_calculate(label_y="max(datum.start, datum.end)")).properties(height=340)


def tuning_curve(candidates: pd.DataFrame, target: float, current: float | None = None,
                 recommended: float | None = None) -> alt.LayerChart:
    """Estimated hit rate and the false-hit upper bound per candidate threshold, the target as a rule."""
    long = candidates.melt(id_vars=["threshold"], value_vars=["est_hit_rate", "false_hit_upper"],
                           var_name="series", value_name="rate").dropna()
    long["series"] = long["series"].map({"est_hit_rate": "estimated hit rate",
                                         "false_hit_upper": "false-hit rate, upper bound"})
    lines = alt.Chart(long).mark_line(point=True).encode(
        x=alt.X("threshold:Q", scale=alt.Scale(zero=False)), y=alt.Y("rate:Q", axis=RATE_AXIS, title="rate"),
        color=alt.Color("series:N", title=""),
        tooltip=[alt.Tooltip("threshold:Q", format=".3f"), alt.Tooltip("series:N"), alt.Tooltip("rate:Q", format=".2%")])
    layers = [lines, alt.Chart(pd.DataFrame({"rate": [target]})).mark_rule(color="red").encode(y="rate:Q")]
    marks = [(current, "gray"), (recommended, "green")]
    for value, colour in marks:
        if value is not None:
            layers.append(alt.Chart(pd.DataFrame({"threshold": [value]})).mark_rule(
                color=colour, strokeDash=[4, 4]).encode(x="threshold:Q"))
    return alt.layer(*layers).properties(height=260)


def near_miss_curve(curve: pd.DataFrame, *, arm_col: str = "arm", x_col: str = "similarity",
                    rate_col: str = "wrong_rate", n_col: str = "labelled") -> alt.Chart:
    """Shadow checks below the threshold: share of near-misses whose nearest answer would have been
    wrong, by similarity (points sized by verdicts)."""
    return alt.Chart(curve).mark_line(point=True).encode(
        x=alt.X(f"{x_col}:Q", title="similarity of the nearest candidate", scale=alt.Scale(zero=False)),
        y=alt.Y(f"{rate_col}:Q", title="would be a false hit", axis=alt.Axis(format="%")),
        color=alt.Color(f"{arm_col}:N", title="arm"),
        size=alt.Size(f"{n_col}:Q", title="verdicts", legend=None),
        tooltip=[arm_col, x_col, alt.Tooltip(f"{rate_col}:Q", format=".1%"), n_col],
    )


def judge_versions(df: pd.DataFrame) -> alt.Chart:
    """Per arm x judge version: hit rate and false-hit rates (users', shadow checks'), side by side."""
    long = df.melt(id_vars=["arm", "judge"], value_vars=["hit_rate", "user_false_hit_rate", "shadow_false_hit_rate"],
                   var_name="rate", value_name="value").dropna(subset=["value"])
    long["rate"] = long["rate"].map({"hit_rate": "hit rate", "user_false_hit_rate": "false hits (users)",
                                     "shadow_false_hit_rate": "false hits (shadow)"})
    return alt.Chart(long).mark_bar().encode(
        x=alt.X("value:Q", title=None, axis=alt.Axis(format="%")),
        y=alt.Y("judge:N", title="judge version"),
        color=alt.Color("judge:N", legend=None),
        row=alt.Row("rate:N", title=None),
        column=alt.Column("arm:N", title="arm"),
        tooltip=["arm", "judge", "rate", alt.Tooltip("value:Q", format=".1%")],
    )


def threshold_sources(df: pd.DataFrame) -> alt.Chart:
    """Per error-bounded arm: the share of its lookups whose threshold each level set, stacked."""
    levels = ["entry", "cluster", "arm", "static"]
    return alt.Chart(df).mark_bar().encode(
        x=alt.X("share:Q", title="share of the arm's lookups", axis=alt.Axis(format="%"), stack="normalize"),
        y=alt.Y("arm:N", title="arm"),
        color=alt.Color("threshold_source:N", title="threshold set by", sort=levels,
                        scale=alt.Scale(domain=levels)),
        order=alt.Order("level_rank:Q"),
        tooltip=["arm", "threshold_source", "requests", alt.Tooltip("share:Q", format=".1%"),
                 alt.Tooltip("hit_rate:Q", format=".1%")],
    ).transform_calculate(level_rank=f"indexof({levels!r}, datum.threshold_source)")
