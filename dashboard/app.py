"""scache dashboard: per-arm attribution, A/B statistics and the threshold control panel.

Run: ``streamlit run dashboard/app.py --server.address 127.0.0.1 --server.port P --server.headless true``.
Settings come from ``SCACHE_*`` variables (cache_core.settings). Pages stay thin:
queries, statistics, charts and the push logic live in the sibling modules.
"""
from __future__ import annotations

import hmac
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

if __package__ in (None, ""):  # `streamlit run dashboard/app.py` puts dashboard/ first on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import streamlit as st

from cache_core.experiments import ExperimentConfig
from cache_core.settings import Settings, get_settings
from dashboard import charts, control, data, processing
from dashboard.queries import Filters

ALL_NAMESPACES = "(all namespaces)"
NO_DATA = "No data yet for this experiment and time range — traffic shows up here once the attribution job writes its first window."


@dataclass(frozen=True)
class View:
    settings: Settings
    experiment_id: str
    time_range: str
    namespace: str | None
    config: ExperimentConfig | None

    @property
    def filters(self) -> Filters:
        """Recomputed on every (fragment) run so the window slides. It ends at the end
        of the current refresh interval (so runs within one interval share the query
        cache and still see everything that arrives during it)."""
        every = self.settings.dashboard.refresh_s
        now = datetime.fromtimestamp((data.refresh_tick(self.settings) + 1) * every, tz=timezone.utc)
        start, end = processing.time_window(self.time_range, now)
        return Filters(self.experiment_id, start, end, self.namespace)


def sidebar(settings: Settings) -> View | None:
    st.sidebar.header("Filters")
    try:
        ids = data.experiment_ids(settings)
    except Exception as exc:  # unreachable warehouse: say where we looked
        st.error(f"Cannot read from ClickHouse at {settings.clickhouse.url}: {exc}")
        return None
    if not ids:
        st.info("No experiments yet: define one in the experiments file or push a config.")
        return None
    experiment_id = st.sidebar.selectbox("Experiment", ids, key="experiment")
    label = st.sidebar.selectbox("Time range", list(processing.TIME_RANGES), index=1, key="time_range")
    spaces = data.run(settings, "namespaces", experiment_id)
    namespace = st.sidebar.selectbox("Namespace", [ALL_NAMESPACES, *spaces], key="namespace")
    st.sidebar.checkbox(f"Auto-refresh every {settings.dashboard.refresh_s}s", value=True, key="auto_refresh")
    return View(settings, experiment_id, label, None if namespace == ALL_NAMESPACES else namespace,
                data.experiment_configs(settings).get(experiment_id))


def overview(view: View) -> None:
    summary = data.run(view.settings, "arm_summary", view.filters)
    if summary.empty or summary["requests"].sum() == 0:
        st.info(NO_DATA)
        return
    latency = data.run(view.settings, "latency_quantiles", view.filters)
    table = processing.overview_frame(summary, latency, view.settings.dashboard.cost_per_call_usd)
    total_requests, total_hits = int(table["requests"].sum()), int(table["hits"].sum())
    cols = st.columns(3)
    cols[0].metric("Requests", f"{total_requests:,}")
    cols[1].metric("Hit rate", f"{total_hits / total_requests:.1%}")
    cols[2].metric("Est. upstream savings", f"${table['savings_usd'].sum():,.2f}")
    st.subheader("Per arm")
    st.dataframe(table, hide_index=True, column_config={
        "hit_rate": st.column_config.NumberColumn("hit rate", format="percent"),
        "ci_low": st.column_config.NumberColumn("95% CI low", format="percent"),
        "ci_high": st.column_config.NumberColumn("95% CI high", format="percent"),
        "p50_ms": st.column_config.NumberColumn("p50 ms", format="%.1f"),
        "p95_ms": st.column_config.NumberColumn("p95 ms", format="%.1f"),
        "latency_mean_ms": st.column_config.NumberColumn("mean ms", format="%.1f"),
        "similarity_mean": st.column_config.NumberColumn("mean similarity", format="%.3f"),
        "savings_usd": st.column_config.NumberColumn("savings", format="$%.2f"),
    })
    st.altair_chart(charts.rate_with_interval(table), use_container_width=True)
    comparison_section(view, summary)


def comparison_section(view: View, summary) -> None:
    baseline = processing.baseline_arm(list(summary["arm"]), view.config)
    comparison = processing.comparison_frame(summary, baseline) if baseline else None
    if comparison is not None and not comparison.empty:
        st.subheader(f"Difference vs {baseline}")
        st.dataframe(comparison, hide_index=True, column_order=[
            "arm", "vs", "diff", "ci_low", "ci_high", "relative_lift", "p", "status", "detail",
        ], column_config={
            "diff": st.column_config.NumberColumn("Δ hit rate", format="percent"),
            "ci_low": st.column_config.NumberColumn("95% CI low", format="percent"),
            "ci_high": st.column_config.NumberColumn("95% CI high", format="percent"),
            "relative_lift": st.column_config.NumberColumn("relative lift", format="percent"),
            "p": st.column_config.TextColumn("p-value"),
        })
    if view.config is None:
        st.caption("Sample-ratio check skipped: no definition for this experiment.")
        return
    srm = processing.srm_for(summary, view.config)
    if srm.mismatch:
        st.warning(f"Sample ratio mismatch: arm sizes {srm.observed} do not match the configured "
                   f"split (chi² = {srm.chi2:.1f}, p = {srm.p_value:.2g}). Check assignment before "
                   "trusting the comparison.")
    elif srm.status == "ok":
        st.caption(f"Sample-ratio check passed (p = {srm.p_value:.3f}).")
    else:
        st.caption(f"Sample-ratio check not computed: {srm.detail}.")


def time_series(view: View) -> None:
    bucket_s = processing.bucket_seconds(view.filters.start, view.filters.end, view.settings.flink.window_s)
    series = data.run(view.settings, "hit_rate_timeseries", view.filters, bucket_s)
    if series.empty:
        st.info(NO_DATA)
        return
    changes = data.run(view.settings, "threshold_changes", view.filters)
    st.altair_chart(charts.hit_rate_over_time(series, changes), use_container_width=True)
    st.caption(f"{bucket_s}s buckets; dashed lines mark threshold changes.")
    if not changes.empty:
        st.dataframe(changes, hide_index=True)


def attribution(view: View) -> None:
    by_cluster = data.run(view.settings, "breakdown", view.filters, "intent_cluster")
    if by_cluster.empty:
        st.info(NO_DATA)
        return
    st.subheader("By intent cluster")
    limit = st.slider("Clusters shown (by volume)", 5, 50, 15, key="cluster_limit")
    st.altair_chart(charts.breakdown_bars(processing.top_clusters(by_cluster, limit), "intent_cluster"),
                    use_container_width=True)
    st.subheader("By cache lifetime")
    by_life = data.run(view.settings, "breakdown", view.filters, "lifetime_bucket")
    st.altair_chart(charts.breakdown_bars(by_life, "lifetime_bucket", value_col="hits",
                                          value_title="hits", percent=False), use_container_width=True)
    st.caption("Where in its TTL the served entry was (fresh < ⅓ TTL ≤ mid < ⅔ TTL ≤ late); misses are 'none'.")
    st.subheader("By index precision")
    precision = processing.precision_frame(data.run(view.settings, "breakdown", view.filters, "index_kind"))
    checked = precision[precision["ann_checks"] > 0]
    if checked.empty:
        st.info("No ANN-vs-exact checks sampled in this range.")
    else:
        st.altair_chart(charts.breakdown_bars(checked, "index_kind", value_col="ann_precision",
                                              value_title="ANN agrees with exact"), use_container_width=True)
    st.dataframe(precision, hide_index=True)


def control_panel(view: View) -> None:
    if view.config is None:
        st.info("This experiment has no definition to change (it only appears in the data).")
        return
    config = view.config
    st.caption(f"Config version {config.version}, last updated by {config.updated_by}.")
    arm = st.selectbox("Arm", [a.name for a in config.arms], key="ctl_arm")
    current = config.arm(arm).threshold
    threshold = st.number_input("New threshold", min_value=0.0, max_value=1.0, value=float(current),
                                step=0.01, format="%.3f", key="ctl_threshold")
    whatif_preview(view, arm, threshold)
    actor = st.text_input("Your name", key="ctl_actor")
    reason = st.text_input("Reason", key="ctl_reason")
    token = None
    if view.settings.dashboard.admin_token is not None:
        token = st.text_input("Admin token", type="password", key="ctl_token")
    if st.button("Push", type="primary", key="ctl_push"):
        push(view, arm, threshold, actor, reason, token)


def whatif_preview(view: View, arm: str, threshold: float) -> None:
    hist = data.run(view.settings, "similarity_histogram", view.filters)
    if hist.empty:
        st.info("No logged decisions in this range for a what-if estimate.")
        return
    estimate = control.whatif_hit_rate(hist, threshold)
    row = estimate[estimate["arm"] == arm]
    if not row.empty:
        st.metric(f"Estimated hit rate of {arm} at {threshold:.3f}", f"{row['est_hit_rate'].iloc[0]:.1%}",
                  delta=f"{row['est_hit_rate'].iloc[0] - row['observed_hit_rate'].iloc[0]:+.1%} vs observed")
    st.altair_chart(charts.whatif_curve(control.whatif_curve(hist), threshold), use_container_width=True)
    st.caption("First-order estimate from logged top-1 similarities: it holds the cache contents fixed.")


def push(view: View, arm: str, threshold: float, actor: str, reason: str, token: str | None) -> None:
    expected = view.settings.dashboard.admin_token
    if expected is not None and not hmac.compare_digest((token or "").encode(),
                                                        expected.get_secret_value().encode()):
        st.error("Wrong or missing admin token: the change was not pushed.")
        return
    try:
        message = control.push_threshold(view.settings, view.experiment_id, arm, threshold,
                                         actor, reason)
    except ValueError as exc:
        st.error(f"Not pushed: {exc}")
        return
    except control.AuditWriteError as exc:
        st.warning(str(exc))
        data.clear()
        return
    except Exception as exc:  # Kafka unreachable etc.: nothing changed
        st.error(f"Push failed, nothing changed: {exc}")
        return
    data.clear()
    st.success(f"Pushed {arm} threshold {threshold:.3f} as config version {message.experiment.version}.")


def main() -> None:
    st.set_page_config(page_title="scache", layout="wide")
    settings = get_settings()
    st.title("scache — semantic cache experiments")
    view = sidebar(settings)
    if view is None:
        return
    f = view.filters
    st.caption(f"{f.experiment_id} · {f.namespace or 'all namespaces'} · "
               f"{f.start:%Y-%m-%d %H:%M} – {f.end:%Y-%m-%d %H:%M} UTC")
    every = settings.dashboard.refresh_s if st.session_state.get("auto_refresh") else None
    tabs = st.tabs(["Overview", "Time series", "Attribution", "Control panel"])
    for tab, page in zip(tabs[:3], (overview, time_series, attribution)):
        with tab:
            st.fragment(page, run_every=every)(view)
    with tabs[3]:
        control_panel(view)


main()
