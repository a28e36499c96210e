"""The time-series page's section: a metric per arm over time, with threshold changes marked."""
from __future__ import annotations

import streamlit as st

from dashboard import charts, data
from dashboard.sections.common import NO_DATA, View, bucket_for, optional


def time_series(view: View) -> None:
    bucket_s = bucket_for(view)
    series = data.run(view.settings, "hit_rate_timeseries", view.filters, bucket_s)
    if series.empty:
        st.info(NO_DATA)
        return
    labels = optional(view, "false_hit_timeseries", view.filters, bucket_s)
    if labels is not None and not labels.empty:
        series = series.merge(labels[["arm", "bucket", "false_hit_rate"]], on=["arm", "bucket"], how="left")
    else:
        series = series.assign(false_hit_rate=None)
    metric = st.selectbox("Metric", list(charts.METRICS), format_func=lambda m: charts.METRICS[m][0], key="ts_metric")
    audit = data.run(view.settings, "threshold_changes", view.filters)
    st.altair_chart(charts.metric_over_time(series, metric, audit), use_container_width=True)
    st.caption(f"{bucket_s}s buckets; dashed lines mark threshold changes.")
    if not audit.empty:
        st.dataframe(audit, hide_index=True)
