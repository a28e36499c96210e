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

import pandas as pd
import streamlit as st

from cache_core.decision.thresholds import multi_for, threshold_for
from cache_core.events import now_ms
from cache_core.experiments import HOLDOUT_ARM, ExperimentConfig
from cache_core.settings import Settings, get_settings
from dashboard.control import attribution as attribution_mod
from dashboard import charts, data
from dashboard.control import autotune, changes, processing, publishing, queries, tuning, tuning_multi, whatif
from dashboard.control.canary import configs_by_version, evaluate_canary, last_failed_try, rolled_back_canaries
from dashboard.control.guardrails import Guardrails
from dashboard.control.queries import Filters
from dashboard.control.stats import ProportionStat

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


def optional(view: View, name: str, *args):
    """A query over a table another component creates (feedback, late events): None if absent."""
    try:
        return data.run(view.settings, name, *args)
    except Exception as exc:  # table not there yet (older warehouse): the page works without it
        st.caption(f"({name} unavailable: {str(exc).splitlines()[0][:160]})")
        return None


def bucket_for(view: View) -> int:
    return processing.bucket_seconds(view.filters.start, view.filters.end, view.settings.flink.window_s)


def overview(view: View) -> None:
    summary = data.run(view.settings, "arm_summary", view.filters)
    if summary.empty or summary["requests"].sum() == 0:
        st.info(NO_DATA)
        return
    latency = data.run(view.settings, "latency_quantiles", view.filters)
    false_hits = optional(view, "false_hits", view.filters)
    dash = view.settings.dashboard
    table = processing.overview_frame(summary, latency, dash.cost_per_call_usd, tokens_per_call=dash.tokens_per_call,
                                      embedding_cost_usd=dash.embedding_cost_per_call_usd, false_hits=false_hits)
    total_requests, total_hits = int(table["requests"].sum()), int(table["hits"].sum())
    cols = st.columns(4)
    cols[0].metric("Requests", f"{total_requests:,}")
    cols[1].metric("Hit rate", f"{total_hits / total_requests:.1%}")
    cols[2].metric("Model calls saved", f"{total_hits:,}")
    cols[3].metric("Net savings", f"${table['net_savings_usd'].sum():,.2f}")
    srm_section(view, summary)
    st.subheader("Per arm")
    pct = lambda label: st.column_config.NumberColumn(label, format="percent")
    st.dataframe(table, hide_index=True, column_order=[
        "arm", "traffic_share", "requests", "hit_rate", "ci_low", "ci_high", "false_hit_rate", "fh_low", "fh_high",
        "labelled", "p50_ms", "p95_ms", "model_calls", "tokens_saved", "savings_usd", "embedding_cost_usd",
        "net_savings_usd"], column_config={
        "traffic_share": pct("traffic share"), "hit_rate": pct("hit rate"),
        "ci_low": pct("95% CI low"), "ci_high": pct("95% CI high"),
        "false_hit_rate": pct("false-hit rate"), "fh_low": pct("FH 95% low"), "fh_high": pct("FH 95% high"),
        "p50_ms": st.column_config.NumberColumn("p50 ms", format="%.1f"),
        "p95_ms": st.column_config.NumberColumn("p95 ms", format="%.1f"),
        "savings_usd": st.column_config.NumberColumn("saved", format="$%.2f"),
        "embedding_cost_usd": st.column_config.NumberColumn("embedding cost", format="$%.4f"),
        "net_savings_usd": st.column_config.NumberColumn("net saved", format="$%.2f"),
    })
    st.caption(f"A hit saves one model call (${dash.cost_per_call_usd:g}, {dash.tokens_per_call} tokens); every "
               f"cached-arm lookup costs ${dash.embedding_cost_per_call_usd:g} of embedding. False-hit rate: wrong "
               "verdicts among feedback-labelled hits.")
    st.altair_chart(charts.rate_with_interval(table), use_container_width=True)
    comparison_section(view, summary)
    variants = optional(view, "variant_summary", view.filters)
    if variants is not None and (variants["variant"] == "canary").any():
        st.subheader("Canary vs base units")
        st.dataframe(variants, hide_index=True)


def comparison_section(view: View, summary) -> None:
    baseline = processing.baseline_arm(list(summary["arm"]), view.config)
    if not baseline:
        return
    series = data.run(view.settings, "hit_rate_timeseries", view.filters, bucket_for(view))
    comparison = processing.comparison_frame(summary, baseline, series)
    if comparison.empty:
        return
    st.subheader(f"Difference vs {baseline}")
    pct = lambda label: st.column_config.NumberColumn(label, format="percent")
    st.dataframe(comparison, hide_index=True, column_order=[
        "arm", "vs", "diff", "ci_low", "ci_high", "p", "prob_beat", "expected_loss", "seq_p", "seq_low",
        "seq_high", "seq_verdict", "status"], column_config={
        "diff": pct("Δ hit rate"), "ci_low": pct("95% CI low"), "ci_high": pct("95% CI high"),
        "p": st.column_config.TextColumn("p (fixed horizon)"),
        "prob_beat": pct("P(beats control)"),
        "expected_loss": st.column_config.NumberColumn("expected loss", format="%.5f"),
        "seq_p": st.column_config.TextColumn("always-valid p"),
        "seq_low": pct("always-valid CI low"), "seq_high": pct("always-valid CI high"),
        "seq_verdict": st.column_config.TextColumn("sequential"),
    })
    st.caption("Fixed-horizon z-test (valid once, at a planned sample size); Beta(1,1)-Binomial posterior; "
               "mSPRT with a N(0, 0.05²) mixture over every refresh bucket — the always-valid p-value is the one "
               "to watch all day.")


def srm_section(view: View, summary) -> None:
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


def attribution(view: View) -> None:
    by_cluster = data.run(view.settings, "breakdown", view.filters, "intent_cluster")
    if by_cluster.empty:
        st.info(NO_DATA)
        return
    st.subheader("By intent cluster")
    limit = st.slider("Clusters shown (by volume)", 5, 50, 15, key="cluster_limit")
    examples = optional(view, "cluster_examples", view.filters)
    shown = processing.top_clusters(by_cluster, limit)
    if examples is not None and not examples.empty:
        shown = processing.with_cluster_examples(shown, examples)
    st.altair_chart(charts.breakdown_bars(shown, "intent_cluster"), use_container_width=True)
    cluster_examples_table(shown, examples)
    left, right = st.columns(2)
    with left:
        st.subheader("By index precision")
        by_index = data.run(view.settings, "breakdown", view.filters, "index_kind")
        st.altair_chart(charts.breakdown_bars(by_index, "index_kind"), use_container_width=True)
        precision = processing.precision_frame(by_index)
        st.dataframe(precision[["arm", "index_kind", "ann_checks", "ann_precision", "ci_low", "ci_high"]],
                     hide_index=True)
    with right:
        st.subheader("By cache lifetime")
        by_life = data.run(view.settings, "breakdown", view.filters, "lifetime_bucket")
        shares = processing.lifetime_shares(by_life)
        st.altair_chart(charts.breakdown_bars(shares, "lifetime_bucket", value_col="share",
                                              value_title="share of the arm's requests"), use_container_width=True)
        st.caption("Where in its TTL the served entry was (fresh < ⅓ TTL ≤ mid < ⅔ TTL ≤ late); misses are 'none'.")
    decomposition_section(view, {"intent_cluster": by_cluster, "index_kind": by_index, "lifetime_bucket": by_life},
                          examples)


def cluster_examples_table(shown: pd.DataFrame, examples: pd.DataFrame | None) -> None:
    """What the charted clusters are about: their most frequent queries, busiest first."""
    if examples is None or examples.empty:
        st.caption("Example queries per cluster appear once the cache emits query texts "
                   "(SCACHE_CACHE__EMIT_QUERY_TEXT=true).")
        return
    volume = shown.groupby("intent_cluster", as_index=False)["requests"].sum().sort_values(
        "requests", ascending=False)
    with st.expander("What these clusters are about", expanded=False):
        st.dataframe(processing.with_cluster_examples(volume, examples), hide_index=True,
                     column_config={"examples": st.column_config.TextColumn("example queries", width="large")})


def decomposition_section(view: View, frames: dict, examples: pd.DataFrame | None = None) -> None:
    arms = sorted(set(frames["intent_cluster"]["arm"]) - {HOLDOUT_ARM})
    if len(arms) < 2:
        return
    st.subheader("Why the hit rates differ")
    baseline = processing.baseline_arm(arms, view.config) or arms[0]
    cols = st.columns(3)
    a = cols[0].selectbox("Baseline arm", arms, index=arms.index(baseline), key="dec_a")
    others = [x for x in arms if x != a]
    b = cols[1].selectbox("Compared arm", others, key="dec_b")
    dim = cols[2].selectbox("Buckets", list(frames), key="dec_dim")
    d = attribution_mod.decompose(frames[dim], dim, a, b)
    st.altair_chart(charts.waterfall(attribution_mod.waterfall_frame(d)), use_container_width=True)
    st.markdown(f"**{b} − {a} = {d.difference:+.2%}**: traffic mix {d.mix_effect:+.2%}, "
                f"hit rates within buckets {d.rate_effect:+.2%}.")
    st.caption("Method: " + attribution_mod.METHOD)
    if dim == "intent_cluster":
        holm = processing.cluster_comparison(frames[dim], a, b)
        if examples is not None and not examples.empty:
            holm = processing.with_cluster_examples(holm, examples)
        st.markdown("Per-cluster differences (Holm-adjusted over all clusters compared)")
        st.dataframe(holm, hide_index=True, column_config={
            "diff": st.column_config.NumberColumn("Δ hit rate", format="percent")})


# -- control panel ---------------------------------------------------------------------

def audit_from_topic(view: View) -> None:
    """``publishing.sync_audit``, so the panel (which reads configs from the warehouse) sees
    admin-API pushes; a broker that cannot be read leaves the panel as it was, with a warning."""
    try:
        written = publishing.sync_audit(view.settings, view.experiment_id, data.client(view.settings))
    except Exception as exc:  # the broker or warehouse is down: reloading what the warehouse has still helps
        st.session_state["ctl_flash_warning"] = f"Could not read the control topic to audit missing versions: {exc}"
        return
    if written:
        st.session_state.setdefault("ctl_flash", []).append(
            f"Audited config version(s) {', '.join(map(str, written))} from the control topic "
            "(pushed past the dashboard).")


def control_panel(view: View) -> None:
    if view.config is None:
        st.info("This experiment has no definition to change (it only appears in the data).")
        return
    config = view.config
    pin = f"loaded_version:{view.experiment_id}"
    loaded = st.session_state.setdefault(pin, config.version)
    st.caption(f"Config version {loaded} loaded, last updated by {config.updated_by}. Reading needs no token; "
               "every change below does.")
    if config.version != loaded:
        st.warning(f"The config moved to version {config.version} since you loaded version {loaded}; "
                   "pushes will be refused until you reload.")
    if st.button("Reload latest config", key="ctl_reload",
                 help="Also audits versions pushed past the dashboard (the cache's admin API)."):
        audit_from_topic(view)
        data.clear()
        st.session_state.pop(pin, None)
        st.rerun()
    for message in st.session_state.pop("ctl_flash", []):
        st.success(message)
    if "ctl_flash_warning" in st.session_state:
        st.warning(st.session_state.pop("ctl_flash_warning"))
    st.text_input("Your name", key="ctl_actor")
    if view.settings.dashboard.admin_token is not None:
        st.text_input("Admin token", type="password", key="ctl_token")
    change_section(view, config)
    canary_section(view, config)
    autotune_section(view, config)
    history_section(view, config)


def anchored_input(label: str, key: str, anchor: tuple, current: float, container=st, **kwargs) -> float:
    """A number input that starts from ``current``. A keyed widget keeps its value across
    reruns, even when another experiment, arm or cluster is picked (another ``anchor``);
    then it starts again from that one's current value, unless the value was edited in
    the same run."""
    state = st.session_state
    edited = key in state and state[key] != state.get(f"{key}_shown")
    if state.get(f"{key}_anchor") != anchor and not edited:
        state[key] = float(current)
    state[f"{key}_anchor"] = anchor
    value = container.number_input(label, key=key, **kwargs)
    state[f"{key}_shown"] = value
    return value


def threshold_input(config, arm: str, cluster: int | None, current: float) -> float:
    """The "New threshold" input, following the picked experiment / arm / cluster."""
    return anchored_input("New threshold", "ctl_threshold", (config.experiment_id, config.version, arm, cluster),
                          current, min_value=0.0, max_value=1.0, step=0.01, format="%.3f")


OTHER_CLUSTER = "another id"


def cluster_input(view: View, config, arm: str, col) -> int:
    """The intent cluster to override: one of the arm's busiest in the window (or already
    overridden), or a typed id."""
    by_cluster = data.run(view.settings, "breakdown", view.filters, "intent_cluster")
    examples = optional(view, "cluster_examples", view.filters)
    choices = processing.cluster_choices(by_cluster, arm, config.arm(arm).cluster_thresholds,
                                         labels=processing.cluster_labels(examples))
    picked = col.selectbox("Intent cluster", [*choices, OTHER_CLUSTER], key="ctl_cluster_pick",
                           format_func=lambda c: choices.get(c, c))
    if picked != OTHER_CLUSTER:
        return int(picked)
    return int(col.number_input("Cluster id", min_value=0, value=0, step=1, key="ctl_cluster"))


def change_section(view: View, config) -> None:
    st.subheader("Change a threshold")
    cols = st.columns(3)
    arm = cols[0].selectbox("Arm", [a.name for a in config.arms], key="ctl_arm")
    scope = cols[1].radio("Scope", ["whole arm", "one intent cluster"], key="ctl_scope", horizontal=True)
    cluster = None
    if scope == "one intent cluster":
        cluster = cluster_input(view, config, arm, cols[2])
    current = threshold_for(config.arm(arm), cluster)
    threshold = threshold_input(config, arm, cluster, current)
    whatif_preview(view, arm, threshold, cluster)
    mode = st.radio("Push as", ["direct", "canary"], key="ctl_mode", horizontal=True,
                    disabled=cluster is not None, help="A canary applies to the whole arm.")
    share, target = 0.1, view.settings.dashboard.target_false_hit_rate
    if mode == "canary" and cluster is None:
        c1, c2 = st.columns(2)
        share = c1.number_input("Canary share of the arm's units", 0.01, 1.0, 0.1, 0.01, key="ctl_canary_share")
        target = c2.number_input("Roll back above false-hit rate", 0.001, 0.5, float(target), 0.005,
                                 format="%.3f", key="ctl_canary_target")
    reason = st.text_input("Reason", key="ctl_reason")
    if st.button("Push", type="primary", key="ctl_push"):
        if cluster is not None:
            change = lambda: changes.set_cluster_threshold(arm, cluster, threshold)
            what = f"{arm} cluster {cluster} threshold {threshold:.3f}"
        elif mode == "canary":
            change = lambda: changes.start_canary(arm, threshold, share, target, at_ms=now_ms())
            what = f"{arm} canary at {threshold:.3f} on {share:.0%} of units"
        else:
            change = lambda: changes.set_threshold(arm, threshold)
            what = f"{arm} threshold {threshold:.3f}"
        act_and_reload(view, change, reason, what)
    if config.arm(arm).similarity == "multi":
        multi_push_section(view, config, arm)
    invalidation_push_section(view, config, arm)


def invalidation_push_section(view: View, config, arm: str) -> None:
    """How many users' "wrong" verdicts take an entry of the arm out of service (cache_core.feedback)."""
    current = config.arm(arm).invalidate_after_wrong
    st.markdown(f"**Wrong answers in {arm}**: feedback removes an entry once this many users got a "
                f"\"wrong\" verdict on its answers, on every replica (now {current}; 0: never)")
    cols = st.columns([1, 2])
    users = int(anchored_input("Users before removal", "ctl_invalidate_after", (config.experiment_id,
                               config.version, arm), current, cols[0], min_value=0.0, max_value=1000.0,
                               step=1.0, format="%.0f"))
    reason = cols[1].text_input("Reason", key="ctl_invalidate_reason")
    if st.button(f"Push wrong-answer removal of {arm}", key="ctl_invalidate_push"):
        moved = f"users before removal {current} → {users}"  # the audit's threshold columns do not move
        act_and_reload(view, lambda: changes.set_invalidate_after(arm, users),
                       "; ".join([moved, reason.strip()]) if reason.strip() else moved,
                       f"{arm} removes entries after {users} users' wrong verdicts")


def multi_push_section(view: View, config, arm: str) -> None:
    """Push a multi arm's score floor / answer margin (the answer-margin what-if above
    estimates their effect); same gate, version check and audit as a threshold push."""
    multi = config.arm(arm).multi
    st.markdown(f"**Score floor and answer margin of {arm}** (multi similarity; currently floor "
                f"{multi.threshold:.3f}, margin {multi.answer_margin:.3f})")
    multi_recommendation(view, config, arm)
    anchor = (config.experiment_id, config.version, arm)
    cols = st.columns(2)
    floor = anchored_input("New score floor", "ctl_multi_floor", anchor, multi.threshold, cols[0],
                           min_value=-1.0, max_value=1.0, step=0.01, format="%.3f")
    margin = anchored_input("New answer margin", "ctl_multi_margin", anchor, multi.answer_margin, cols[1],
                            min_value=0.0, max_value=1.0, step=0.001, format="%.3f")
    mode = st.radio("Push floor / margin as", ["direct", "canary"], key="ctl_multi_mode", horizontal=True,
                    help="A canary tries them on a share of the arm's units (at the arm's threshold) until "
                         "promoted or rolled back.")
    share, target = 0.1, view.settings.dashboard.target_false_hit_rate
    if mode == "canary":
        c1, c2 = st.columns(2)
        share = c1.number_input("Canary share of the arm's units", 0.01, 1.0, 0.1, 0.01, key="ctl_multi_canary_share")
        target = c2.number_input("Roll back above false-hit rate", 0.001, 0.5, float(target), 0.005,
                                 format="%.3f", key="ctl_multi_canary_target")
    reason = st.text_input("Reason", key="ctl_multi_reason")
    if st.button(f"Push floor / margin of {arm}", key="ctl_multi_push"):
        # The audit row's threshold columns do not move for this change: the reason says what did.
        moved = [f"{name} {old:.3f} → {new:.3f}" for name, old, new in (
            ("score floor", multi.threshold, floor), ("answer margin", multi.answer_margin, margin)) if old != new]
        changed = dict(score_floor=floor if floor != multi.threshold else None,
                       answer_margin=margin if margin != multi.answer_margin else None)
        if mode == "canary":
            change = lambda: changes.start_multi_canary(arm, share, target, now_ms(), **changed)
            what = f"{arm} canary with score floor {floor:.3f}, answer margin {margin:.3f} on {share:.0%} of units"
        else:
            change = lambda: changes.set_multi(arm, score_floor=floor, answer_margin=margin)
            what = f"{arm} score floor {floor:.3f}, answer margin {margin:.3f}"
        act_and_reload(view, change, "; ".join(moved + [reason.strip()] if reason.strip() else moved), what)


def logged_history(view: View, config) -> tuple[pd.DataFrame, dict]:
    """The experiment's audit rows and every config version they, the file and ``config`` know."""
    history = data.run(view.settings, "change_history", view.experiment_id)
    return history, configs_by_version(history, data.file_configs(view.settings).get(view.experiment_id),
                                              config)


def multi_recommendation(view: View, config, arm: str) -> None:
    """The auto-tune recommendation for a multi arm's floor / margin (what ``python -m
    dashboard.control.autotune`` would push, with the auto-tune section's guardrails), and a button
    that copies it into the inputs below; pushing stays a separate, explicit step."""
    rules = queries.multi_rules(config)
    hist = optional(view, "multi_score_histogram", view.filters, rules)
    if hist is None:
        return
    history, configs = logged_history(view, config)
    last = data.run(view.settings, "last_changes", view.experiment_id)
    last_ms = queries.last_change_ms(last)
    guardrails, now = page_guardrails(view), now_ms()
    recs = [r for r in tuning_multi.recommend_multi_all(config, hist, configs, guardrails, now_ms=now,
                                                  last_change_ms=last_ms) if r.arm == arm]
    if not recs:
        st.caption(f"Auto-tune: {arm} has a running canary; its floor / margin are tuned after it ends.")
        return
    rec = recs[0]
    pct = lambda x: "—" if x is None or pd.isna(x) else f"{x:.1%}"
    failed = last_failed_try(rolled_back_canaries(history, configs), arm, "score_floor", now,
                                    guardrails)
    probe = tuning_multi.multi_exploration(rec, failed) or rec
    if probe.action == "explore":
        st.info(f"Auto-tune would explore on a canary: {probe.reason}. Est. hit rate there "
                f"{pct(probe.recommended_hit_rate)} (now {pct(rec.current_hit_rate)}); its false-hit rate is "
                "unknown until the canary's units are labelled.")
        st.button("Use the exploration (as a canary)", key="ctl_multi_use_explore",
                  on_click=lambda: st.session_state.update(
                      ctl_multi_floor=probe.recommended_floor, ctl_multi_margin=probe.recommended_margin,
                      ctl_multi_mode="canary", ctl_multi_reason=f"exploration: {probe.reason}"))
        return
    rec = probe  # a hold may now say why it does not explore
    if rec.action != "change":
        st.caption(f"Auto-tune recommends no change to {arm}'s floor / margin: {rec.reason} "
                   f"({rec.decisions} decisions; est. hit rate now {pct(rec.current_hit_rate)}).")
        return
    st.info(f"Auto-tune recommends score floor **{rec.recommended_floor:.3f}** and answer margin "
            f"**{rec.recommended_margin:.3f}** for {arm}: est. hit rate {pct(rec.recommended_hit_rate)} (now "
            f"{pct(rec.current_hit_rate)}), false-hit rate {pct(rec.false_hit_rate)} with 95% upper bound "
            f"{pct(rec.false_hit_upper)} over {rec.labelled} labelled hits, from {rec.decisions} logged decisions "
            f"({rec.reason}). Replayed from the logged mixed scores at the logged cosine gates, never under the "
            f"lowest floor {rec.lowest_floor:.3f} / margin {rec.lowest_margin:.3f} they were logged at.")

    def use() -> None:  # runs before the inputs are drawn again, so they show it
        st.session_state["ctl_multi_floor"] = rec.recommended_floor
        st.session_state["ctl_multi_margin"] = rec.recommended_margin
        st.session_state["ctl_multi_reason"] = f"auto-tune recommendation: {rec.reason}"

    st.button("Use the recommendation", key="ctl_multi_use_rec", on_click=use,
              help="Copies it into the inputs below; nothing is pushed until you press Push.")


def whatif_preview(view: View, arm: str, threshold: float, cluster: int | None) -> None:
    rules = queries.multi_rules(view.config)
    hist = data.run(view.settings, "similarity_histogram", view.filters, rules)
    if hist.empty:
        st.info("No logged decisions in this range for a what-if estimate.")
        return
    scoped = hist if cluster is None else hist[hist["intent_cluster"] == cluster]
    labelled = optional(view, "labelled_similarity", view.filters, rules)
    estimate = whatif.whatif_hit_rate(scoped, threshold)
    row = estimate[estimate["arm"] == arm]
    cols = st.columns(2)
    if not row.empty:
        cols[0].metric(f"Estimated hit rate of {arm} at {threshold:.3f}", f"{row['est_hit_rate'].iloc[0]:.1%}",
                       delta=f"{row['est_hit_rate'].iloc[0] - row['observed_hit_rate'].iloc[0]:+.1%} vs observed")
    if labelled is not None:
        mine = labelled[(labelled["arm"] == arm) & ((cluster is None) | (labelled["intent_cluster"] == cluster))]
        fh = whatif.threshold_table(scoped[scoped["arm"] == arm], mine, [threshold]).iloc[0]
        if fh["labelled"]:
            cols[1].metric(f"Estimated false-hit rate at {threshold:.3f}", f"{fh['false_hit_rate']:.1%}",
                           help=f"{fh['wrong']} wrong of {fh['labelled']} labelled hits at or above the threshold")
            cols[1].caption(f"95% upper bound {fh['false_hit_upper']:.1%} ({fh['labelled']} labels)"
                            + ("" if fh["supported"] else " — below the lowest labelled similarity: extrapolated"))
        else:
            cols[1].caption("No feedback-labelled hits at or above this threshold.")
    curve = whatif.drop_unreplayable(whatif.whatif_curve(scoped), scoped)
    st.altair_chart(charts.whatif_curve(curve, threshold), use_container_width=True)
    st.caption("First-order estimate from logged top-1 similarities: it holds the cache contents fixed.")
    rule = next((r for r in rules if r.arm == arm), None)
    if rule is not None:
        multi_whatif_notes(view, rule, scoped[scoped["arm"] == arm], threshold)
        margin_whatif(view, rule, hist[hist["arm"] == arm], rules)


def multi_whatif_notes(view: View, rule: queries.MultiRule, arm_hist, threshold: float) -> None:
    """What the threshold what-if of a multi arm can and cannot replay."""
    floor = whatif.replay_floor(arm_hist)
    st.caption(f"{rule.arm} is a multi-similarity arm: a decision counts as a hit only if its logged mixed score "
               f"also reaches the floor {rule.score_floor:.3f} and leads the best other answer by "
               f"{rule.answer_margin:.3f} (the arm's current settings, same weights, guards aside). Scores were "
               "logged for candidates past the cosine threshold in force at the time, so raising the threshold is "
               "approximate and lowering it below the lowest logged one cannot be replayed: the curve stops there.")
    if floor is not None and threshold < floor - 1e-9:
        st.warning(f"{threshold:.3f} is below the lowest logged cosine threshold {floor:.3f} of {rule.arm}: "
                   "candidates between the two were never ranked, so the estimate above is that of "
                   f"{floor:.3f}, not of {threshold:.3f}. Try it on a canary to find out.")


def margin_whatif(view: View, rule: queries.MultiRule, arm_hist, rules) -> None:
    """Hits and labelled false hits of a multi arm at a few answer margins (whole arm)."""
    margins = optional(view, "multi_margin_histogram", view.filters, rules)
    if margins is None:
        return
    with st.expander(f"Answer-margin what-if for {rule.arm} (whole arm, cosine thresholds as logged)"):
        table = whatif.margin_table(margins[margins["arm"] == rule.arm], int(arm_hist["decisions"].sum()),
                                    whatif.margin_grid(rule.answer_margin))
        pct = lambda label: st.column_config.NumberColumn(label, format="percent")
        st.dataframe(table, hide_index=True, column_config={
            "est_hit_rate": pct("est. hit rate"), "false_hit_rate": pct("false-hit rate"),
            "false_hit_upper": pct("false-hit 95% upper")})
        st.caption(f"Current margin {rule.answer_margin:.3f}, score floor {rule.score_floor:.3f}. Exact replay of "
                   "the logged scores at the logged cosine gates, guards aside; the false-hit rate counts the "
                   "labelled hits each margin would still serve. supported=false: that margin would serve "
                   "decisions no label covers.")


def canary_summary(arm) -> str:
    """What the canary tries against what the arm runs."""
    tried = f"canary threshold {arm.canary.threshold:.3f} (arm {arm.threshold:.3f})"
    if arm.canary.multi_override:
        trial, base = multi_for(arm, "canary"), arm.multi
        tried += (f", score floor {trial.threshold:.3f} (arm {base.threshold:.3f}), answer margin "
                  f"{trial.answer_margin:.3f} (arm {base.answer_margin:.3f})")
    return tried


def canary_section(view: View, config) -> None:
    running = [a for a in config.arms if a.canary is not None]
    if not running:
        return
    st.subheader("Running canaries")
    for arm in running:
        stats = optional(view, "canary_stats", view.experiment_id, arm.name, arm.canary.started_at_ms)
        canary_rows = stats[stats["variant"] == "canary"] if stats is not None else None
        n_wrong = (0, 0) if canary_rows is None else (
            int(canary_rows["correct"].sum() + canary_rows["wrong"].sum()), int(canary_rows["wrong"].sum()))
        decision = evaluate_canary(arm.canary, ProportionStat(*n_wrong), alpha=0.05)
        st.markdown(f"**{arm.name}**: {canary_summary(arm)} on {arm.canary.share:.0%} of units; verdict "
                    f"**{decision.action}** — {decision.reason}.")
        if stats is not None:
            st.dataframe(stats, hide_index=True)
        c1, c2 = st.columns(2)
        if c1.button(f"Promote {arm.name} canary", key=f"ctl_promote_{arm.name}"):
            act_and_reload(view, lambda a=arm.name: changes.promote_canary(a), f"promote: {decision.reason}",
                f"{arm.name} canary promoted")
        if c2.button(f"Roll back {arm.name} canary", key=f"ctl_canary_rollback_{arm.name}"):
            act_and_reload(view, lambda a=arm.name: changes.rollback_canary(a), f"rollback: {decision.reason}",
                f"{arm.name} canary rolled back")


def _guardrail_defaults(view: View) -> dict:
    return {"tune_target": float(view.settings.dashboard.target_false_hit_rate), "tune_min_labelled": 30,
            "tune_max_step": 0.03, "tune_cooldown": 1800}


def _guardrails(target, min_labelled, max_step, cooldown) -> Guardrails:
    return Guardrails(target_false_hit_rate=float(target), min_labelled=int(min_labelled),
                             max_step=float(max_step), cooldown_s=float(cooldown), min_decisions=200)


def page_guardrails(view: View) -> Guardrails:
    """The auto-tune section's guardrails as last set (its inputs are drawn further down the page)."""
    return _guardrails(*(st.session_state.get(k, v) for k, v in _guardrail_defaults(view).items()))


def guardrails_from_page(view: View) -> Guardrails:
    d = _guardrail_defaults(view)
    cols = st.columns(4)
    target = cols[0].number_input("Target false-hit rate", 0.001, 0.5, d["tune_target"], 0.005, format="%.3f",
                                  key="tune_target")
    min_labelled = cols[1].number_input("Min labelled hits", 0, 100_000, d["tune_min_labelled"], 10,
                                        key="tune_min_labelled")
    max_step = cols[2].number_input("Max step", 0.005, 0.5, d["tune_max_step"], 0.005, format="%.3f",
                                    key="tune_max_step")
    cooldown = cols[3].number_input("Cool-down (s)", 0, 7 * 86400, d["tune_cooldown"], 60, key="tune_cooldown")
    return _guardrails(target, min_labelled, max_step, cooldown)


def autotune_section(view: View, config) -> None:
    st.subheader("Auto-tune")
    guardrails = guardrails_from_page(view)
    per_cluster = st.checkbox("Also per intent cluster", key="tune_clusters")
    rules = queries.multi_rules(config)
    hist = data.run(view.settings, "similarity_histogram", view.filters, rules)
    labelled = optional(view, "labelled_similarity", view.filters, rules)
    if hist.empty or labelled is None:
        st.info("Auto-tune needs logged decisions and feedback-labelled hits in this range.")
        return
    last = data.run(view.settings, "last_changes", view.experiment_id)
    last_ms = queries.last_change_ms(last)
    recs = tuning.recommend_all(config, hist, labelled, guardrails, now_ms=now_ms(), last_change_ms=last_ms,
                                clusters=per_cluster)
    as_canary = st.checkbox("Apply arm-level changes as a canary", value=True, key="tune_as_canary",
                            help="Also lets an arm held at its best supported threshold explore one step lower "
                                 "on a canary, where no labels exist yet.")
    shares = canary_shares(as_canary)
    if as_canary:
        failed, now = rolled_back_canaries(*logged_history(view, config)), now_ms()
        recs = [tuning.exploration(r, last_failed_try(failed, r.arm, "threshold", now, guardrails)) or r
                for r in recs]
    table = pd.DataFrame([{"arm": r.arm, "cluster": "arm" if r.cluster is None else str(r.cluster), "current": r.current,
              "recommended": r.recommended, "action": r.action, "est. hit rate now": r.current_hit_rate,
              "est. hit rate then": r.recommended_hit_rate, "false-hit upper bound": r.false_hit_upper,
              "labels": r.labelled, "why": r.reason} for r in recs])
    st.dataframe(table, hide_index=True, column_config={
        "est. hit rate now": st.column_config.NumberColumn(format="percent"),
        "est. hit rate then": st.column_config.NumberColumn(format="percent"),
        "false-hit upper bound": st.column_config.NumberColumn(format="percent")})
    arm_recs = [r for r in recs if r.cluster is None and not r.candidates.empty]
    if arm_recs:
        shown = st.selectbox("Curve of arm", [r.arm for r in arm_recs], key="tune_curve_arm")
        rec = next(r for r in arm_recs if r.arm == shown)
        candidates = rec.candidates[rec.candidates["replayable"]]
        st.altair_chart(charts.tuning_curve(candidates, guardrails.target_false_hit_rate, rec.current,
                                            rec.recommended), use_container_width=True)
        st.caption("Recommended: the highest estimated hit rate whose one-sided 95% Clopper-Pearson upper bound "
                   "of the false-hit rate (labelled hits at or above the threshold) stays under the target.")
    if rules:
        st.caption(f"Multi-similarity arms ({', '.join(r.arm for r in rules)}): estimates re-apply each arm's "
                   "current score floor and answer margin to the logged mixed scores. Those exist only for "
                   "candidates past the cosine threshold logged at the time, so thresholds below the lowest "
                   "logged one cannot be replayed: they are left out of the curve and never recommended. "
                   "Their score floor / answer margin recommendation is shown next to its inputs in the change "
                   "section; the scheduled and command-line auto-tune push a change directly and an exploration "
                   "(a lower floor the logs cannot replay) as a canary.")
    to_apply = [r for r in recs if r.action in ("change", "explore")]
    if to_apply and st.button(f"Apply {len(to_apply)} recommendation(s)", key="tune_apply"):
        if not authorized(view):
            return
        for r in to_apply:
            if r.cluster is not None:
                change = lambda r=r: changes.set_cluster_threshold(r.arm, r.cluster, r.recommended)
            elif as_canary:
                share = shares.explore if r.action == "explore" else shares.change
                change = lambda r=r, share=share: changes.start_canary(r.arm, r.recommended, share,
                                                                      guardrails.target_false_hit_rate,
                                                                      at_ms=now_ms())
            else:
                change = lambda r=r: changes.set_threshold(r.arm, r.recommended)
            if not act(view, change, f"auto-tune recommendation: {r.reason}",
                       f"{r.arm}{'' if r.cluster is None else f' cluster {r.cluster}'} → {r.recommended:.3f}"):
                break
        else:
            st.rerun()
    scheduled_autotune(view, guardrails, per_cluster, shares)


@dataclass(frozen=True)
class CanaryShares:
    change: float
    """Share of an arm's units a recommended change is tried on first (0: pushed directly)."""
    explore: float
    """Share an exploration runs on (0: no explorations)."""


def canary_shares(as_canary: bool) -> CanaryShares:
    if not as_canary:
        return CanaryShares(0.0, 0.0)
    cols = st.columns(2)
    change = cols[0].number_input("Canary share", 0.01, 1.0, 0.10, 0.01, format="%.2f", key="tune_canary_share",
                                  help="Share of an arm's units that try a recommended change first.")
    explore = cols[1].number_input("Exploration share", 0.01, 1.0, 0.10, 0.01, format="%.2f",
                                   key="tune_explore_share",
                                   help="Share an exploration (a threshold no label reaches yet) runs on; "
                                        "smaller risks fewer users while it is judged, but takes longer.")
    return CanaryShares(float(change), float(explore))


def scheduled_autotune(view: View, guardrails: Guardrails, per_cluster: bool, shares: CanaryShares) -> None:
    every = st.number_input("Re-tune every (s)", 30, 86400, 300, 30, key="tune_every")
    on = st.toggle("Auto-tune on a schedule while this page is open", key="tune_scheduled")
    st.caption("Unattended: run `python -m dashboard.control.autotune --every N` under any scheduler; it applies the same "
               "guardrails, evaluates canaries (promote / roll back) and audits every push.")
    if not on:
        return
    if not authorized(view, quiet=True):
        st.error("Scheduled auto-tune needs your name and the admin token.")
        return

    def tick() -> None:
        try:
            actions = autotune.tune_experiment(
                view.settings, view.experiment_id, guardrails, client=data.client(view.settings),
                actor=f"autotune ({st.session_state.get('ctl_actor', '').strip()})", clusters=per_cluster,
                canary_share=shares.change, explore_share=shares.explore)
        except Exception as exc:
            st.error(f"Auto-tune run failed: {exc}")
            return
        if any(a.applied for a in actions):
            data.clear()
            st.session_state.pop(f"loaded_version:{view.experiment_id}", None)
        st.caption(f"Last auto-tune run {datetime.now(timezone.utc):%H:%M:%S} UTC")
        st.dataframe([a.__dict__ for a in actions], hide_index=True)

    st.fragment(tick, run_every=float(every))()


def history_section(view: View, config) -> None:
    st.subheader("History and rollback")
    history = data.run(view.settings, "change_history", view.experiment_id)
    if history.empty:
        st.caption("No pushes recorded for this experiment yet.")
        return
    st.dataframe(history.drop(columns=["config_json"]), hide_index=True)
    file_config = data.file_configs(view.settings).get(view.experiment_id)
    previous = changes.previous_config(history, config, fallback=file_config)
    if previous is None:
        return
    now = {a.name: a.invalidate_after_wrong for a in config.arms}
    thresholds = ", ".join(f"{a.name} {a.threshold:.3f}" + (
        f" floor {a.multi.threshold:.3f} margin {a.multi.answer_margin:.3f}" if a.similarity == "multi" else "") + (
        f" removal after {a.invalidate_after_wrong}" if now.get(a.name, a.invalidate_after_wrong)
        != a.invalidate_after_wrong else "") for a in previous.arms)
    if st.button(f"Roll back to version {previous.version} ({thresholds})", key="ctl_rollback"):
        act_and_reload(view, lambda: changes.restore_thresholds(previous), f"rollback to version {previous.version}",
            f"thresholds (and multi settings) of version {previous.version}")


def authorized(view: View, quiet: bool = False) -> bool:
    expected = view.settings.dashboard.admin_token
    token = st.session_state.get("ctl_token") or ""
    if expected is not None and not hmac.compare_digest(token.encode(), expected.get_secret_value().encode()):
        if not quiet:
            st.error("Wrong or missing admin token: the change was not pushed.")
        return False
    return True


def act(view: View, make_change, reason: str, what: str) -> bool:
    """Authorise, then publish one change against the version the operator loaded."""
    if not authorized(view):
        return False
    pin = f"loaded_version:{view.experiment_id}"
    try:
        message = publishing.publish_change(view.settings, view.experiment_id, make_change(),
                                         st.session_state.get("ctl_actor", ""), reason,
                                         expected_version=st.session_state.get(pin), client=data.client(view.settings))
    except publishing.VersionConflict as exc:
        st.error(f"Not pushed: {exc}")
        return False
    except ValueError as exc:
        st.error(f"Not pushed: {exc}")
        return False
    except publishing.AuditWriteError as exc:
        st.warning(str(exc))
        st.session_state[pin] = exc.control_message.experiment.version
        data.clear()
        return False
    except Exception as exc:  # Kafka unreachable etc.: nothing changed
        st.error(f"Push failed, nothing changed: {exc}")
        return False
    st.session_state[pin] = message.experiment.version
    data.clear()
    st.session_state.setdefault("ctl_flash", []).append(f"Pushed {what} as config version {message.experiment.version}.")
    return True


def act_and_reload(view: View, make_change, reason: str, what: str) -> None:
    """``act``, then re-run the page so every panel shows the new version."""
    if act(view, make_change, reason, what):
        st.rerun()


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
