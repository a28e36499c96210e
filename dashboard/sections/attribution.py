"""The attribution page's sections: breakdowns by intent cluster, index precision and cache
lifetime, why two arms' hit rates differ (mix vs rate, Holm-adjusted per cluster), hit rate
by the store tier that served it, and the judge versions."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from cache_core.experiments import HOLDOUT_ARM
from dashboard import charts, data
from dashboard.control import attribution as attribution_mod
from dashboard.control import processing, verdicts
from dashboard.sections.common import NO_DATA, View, optional


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
    tier_section(view)
    judge_section(view)
    threshold_source_section(view)


def tier_section(view: View) -> None:
    """Hit rate per arm split by the store tier (memory / disk) that served the hits."""
    st.subheader("By store tier")
    tiers = optional(view, "tier_hit_rates", view.filters)  # window_agg.disk_hits: migration 0014
    if tiers is None or tiers.empty or not tiers["hits"].any():
        st.info("No hits in this range yet.")
        return
    st.altair_chart(charts.tier_hit_rates(tiers), use_container_width=True)
    st.caption("Hits served from memory, and from an arm's disk tier (`disk_entries`: cold entries on local "
               "disk, promoted on a hit); each bar adds up to the arm's hit rate.")


NO_JUDGE = "No arm has a judge in this range: every hit was decided by its threshold (an arm names one with `judge`)."


def judge_section(view: View) -> None:
    """Hit rate, false-hit rates (users', shadow checks') and added latency per arm x judge version."""
    st.subheader("By judge version")
    table = verdicts.judge_frame(optional(view, "judge_versions", view.filters))
    if table.empty:
        st.info(NO_JUDGE)
        return
    st.altair_chart(charts.judge_versions(table), use_container_width=True)
    pct = lambda label: st.column_config.NumberColumn(label, format="percent")
    st.dataframe(table, hide_index=True, column_order=[
        "arm", "judge", "requests", "hit_rate", "user_false_hit_rate", "user_labelled", "shadow_false_hit_rate",
        "shadow_labelled", "judged", "judge_ms_mean", "judge_ms_p95"], column_config={
        "hit_rate": pct("hit rate"), "user_false_hit_rate": pct("false hits (users)"),
        "shadow_false_hit_rate": pct("false hits (shadow)"), "user_labelled": "users' verdicts",
        "shadow_labelled": "shadow verdicts", "judged": "lookups judged",
        "judge_ms_mean": st.column_config.NumberColumn("judge ms (mean)", format="%.1f"),
        "judge_ms_p95": st.column_config.NumberColumn("judge ms (p95)", format="%.1f")})
    st.caption("Added latency: the judge stage's own time (judge_ms) on the lookups it judged. The users' "
               "false-hit rate rests on users' verdicts only; the shadow one on background re-asks of the "
               "upstream model compared by the answer-equivalence check. Whether a version is better is the "
               "overview's and the canary's call (sequential tests on users' verdicts).")


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


def error_bounded_arms(view: View) -> list[str]:
    """The experiment's arms whose threshold policy is error-bounded ([] without a definition)."""
    if view.config is None:
        return []
    return [a.name for a in view.config.arms if a.threshold_policy.kind == "error_bounded"]


def threshold_source_section(view: View) -> None:
    """Error-bounded arms only: which level set each lookup's threshold, and hit / false-hit rates per level."""
    arms = error_bounded_arms(view)
    table = verdicts.threshold_source_frame(optional(view, "threshold_sources", view.filters))
    if table.empty and not arms:
        return  # no error-bounded arm: nothing to show
    st.subheader("Error-bounded thresholds: which level decided")
    if table.empty:
        st.info(f"No lookups of the error-bounded arm(s) {', '.join(arms)} in this range yet.")
        return
    st.altair_chart(charts.threshold_sources(table), use_container_width=True)
    pct = lambda label: st.column_config.NumberColumn(label, format="percent")
    st.dataframe(table, hide_index=True, column_order=[
        "arm", "threshold_source", "requests", "share", "hit_rate", "user_false_hit_rate", "user_labelled",
        "shadow_false_hit_rate", "shadow_labelled"], column_config={
        "threshold_source": "threshold set by", "share": pct("share of lookups"), "hit_rate": pct("hit rate"),
        "user_false_hit_rate": pct("false hits (users)"), "shadow_false_hit_rate": pct("false hits (shadow)"),
        "user_labelled": "users' verdicts", "shadow_labelled": "shadow verdicts"})
    st.caption("Each lookup's threshold comes from its entry's learnt curve, else its intent cluster's, else the "
               "arm's; 'static' is the arm's configured start, used until the arm holds enough verdicts to "
               "certify its bound δ (not bounded). False-hit rates: users' and shadow checks' verdicts on hits, apart.")
