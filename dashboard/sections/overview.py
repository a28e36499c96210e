"""The overview page's sections: per-arm table, sample-ratio check, comparison with the baseline."""
from __future__ import annotations

import streamlit as st

from dashboard import charts, data
from dashboard.control import processing, shadow_estimate, solicited, verdicts
from dashboard.sections.common import NO_DATA, View, bucket_for, optional


def overview(view: View) -> None:
    summary = data.run(view.settings, "arm_summary", view.filters)
    if summary.empty or summary["requests"].sum() == 0:
        st.info(NO_DATA)
        return
    latency = data.run(view.settings, "latency_quantiles", view.filters)
    false_hits = optional(view, "false_hits", view.filters)
    units = optional(view, "unit_stats", view.filters)
    unit_false_hits = optional(view, "unit_false_hits", view.filters) if units is not None else None
    dash = view.settings.dashboard
    table = processing.overview_frame(summary, latency, dash.cost_per_call_usd, tokens_per_call=dash.tokens_per_call,
                                      embedding_cost_usd=dash.embedding_cost_per_call_usd, false_hits=false_hits,
                                      units=units, unit_false_hits=unit_false_hits)
    total_requests, total_hits = int(table["requests"].sum()), int(table["hits"].sum())
    cols = st.columns(4)
    cols[0].metric("Requests", f"{total_requests:,}")
    cols[1].metric("Hit rate", f"{total_hits / total_requests:.1%}")
    cols[2].metric("Model calls saved", f"{total_hits:,}")
    cols[3].metric("Net savings", f"${table['net_savings_usd'].sum():,.2f}")
    srm_section(view, units)
    st.subheader("Per arm")
    pct = lambda label: st.column_config.NumberColumn(label, format="percent")
    st.dataframe(table, hide_index=True, column_order=[
        "arm", "traffic_share", "requests", "users", "hit_rate", "ci_low", "ci_high", "false_hit_rate", "fh_low",
        "fh_high", "labelled", "p50_ms", "p95_ms", "model_calls", "tokens_saved", "savings_usd", "embedding_cost_usd",
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
    st.caption(basis_note(table["basis"].iloc[0]))
    st.altair_chart(charts.rate_with_interval(table), use_container_width=True)
    verdicts_section(view, false_hits)
    solicited_section(view)
    comparison_section(view, summary)
    variants = optional(view, "variant_summary", view.filters)
    if variants is not None and (variants["variant"] == "canary").any():
        st.subheader("Canary vs base units")
        st.dataframe(variants, hide_index=True)


def solicited_section(view: View) -> None:
    """The false-hit rate from verdicts the service asked for on a random sample of hits (arms with a
    feedback_sample_rate), apart from the verdicts users gave unasked."""
    units = optional(view, "unit_solicited_false_hits", view.filters)
    response = optional(view, "solicited_response", view.filters) if units is not None else None
    table = solicited.estimates_frame(units, response)
    if table.empty:
        return
    st.subheader("False hits: users asked at random")
    pct = lambda label: st.column_config.NumberColumn(label, format="percent")
    st.dataframe(table, hide_index=True, column_config={
        "false_hit_rate": pct("false-hit rate"), "low": pct("95% low"), "high": pct("95% high"),
        "coverage": pct("answered"), "if_unanswered_wrong": pct("if every unanswered were wrong"),
        "basis": "rests on"})
    st.caption("Hits the service asked about (feedback_requested, drawn at the arm's feedback_sample_rate), each "
               "verdict weighed by 1 / that probability, intervals per user. Verdicts users gave unasked are not "
               "in it. The estimate assumes answering does not depend on the answer being right; the last column "
               "holds regardless.")


def verdicts_section(view: View, false_hits) -> None:
    """Users' and shadow checks' false-hit rates side by side, never pooled."""
    shadow = optional(view, "shadow_verdicts", view.filters)
    if shadow is None or shadow.empty:
        return
    st.subheader("False hits: users vs shadow checks")
    pct = lambda label: st.column_config.NumberColumn(label, format="percent")
    st.dataframe(verdicts.user_vs_shadow(false_hits, shadow), hide_index=True, column_config={
        "user_false_hit_rate": pct("users: false-hit rate"), "shadow_false_hit_rate": pct("shadow: false-hit rate"),
        "near_miss_wrong_rate": pct("near-misses: would be wrong"), "user_labelled": "users: labelled",
        "shadow_labelled": "shadow: checked hits", "near_miss_labelled": "near-misses checked"})
    st.caption("Users' rate rests on users' verdicts only: it is the one the per-arm table, the "
               "comparisons, the canaries and auto-tune use. Shadow rates rest on the upstream model asked "
               "again in the background and an answer-equivalence check (SCACHE_SHADOW__EQUIVALENCE): a random "
               "sample of hits, as good as that check. Near-misses: misses just below the threshold whose "
               "nearest cached answer was compared with the upstream's, the false-hit rate a lower threshold "
               "would add.")
    strata = optional(view, "shadow_strata", view.filters)
    estimates = shadow_estimate.estimates_frame(false_hits, strata)
    if not estimates.empty:
        st.dataframe(estimates, hide_index=True, column_config={
            "false_hit_rate": pct("false-hit rate"), "low": pct("95% low"), "high": pct("95% high"),
            "coverage": pct("hits in checked hours"), "basis": "rests on"})
        st.caption("Each number says what it rests on. The weighted shadow estimate counts every checked hit "
                   "by 1 / its inclusion probability (checked / hits in its hour: the sampling share thinned "
                   "by the check budget), so busy hours are not under-represented; users' verdicts have no "
                   "known inclusion probability and are shown as they are.")
    curve = verdicts.near_miss_curve(shadow)
    if not curve.empty:
        st.altair_chart(charts.near_miss_curve(curve), use_container_width=True)


def comparison_section(view: View, summary) -> None:
    baseline = processing.baseline_arm(list(summary["arm"]), view.config)
    if not baseline:
        return
    units = optional(view, "unit_stats", view.filters)
    if units is not None:
        path = optional(view, "unit_path", view.filters, bucket_for(view))
        comparison = processing.comparison_frame(summary, baseline, units=units, unit_path=path)
    else:
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
    if units is not None:
        st.caption("Per user (the unit of randomisation): hit rate as a ratio of per-user sums, delta-method "
                   "variances. Fixed-horizon z-test (valid once, at a planned sample size); normal posterior of the "
                   "difference; mSPRT with a N(0, 0.05²) mixture over every refresh bucket — the always-valid "
                   "p-value is the one to watch all day.")
    else:
        st.caption("Per request (no per-user data in the warehouse): fixed-horizon z-test; Beta(1,1)-Binomial "
                   "posterior; mSPRT with a N(0, 0.05²) mixture. Requests of one user are not independent, so "
                   "these understate the uncertainty.")


def basis_note(basis: str) -> str:
    """What the per-arm table's numbers are per."""
    if basis == processing.PER_USER:
        return ("Requests, hit rate, false-hit rate, latency and savings are per request (descriptive). The 95% "
                "intervals are per user, the unit the experiment randomises: the rate's variance by the delta "
                "method over each arm's users (from the decisions, last 14 days at most).")
    return ("All numbers per request: no per-user data in the warehouse, so the intervals treat requests as "
            "independent and are too narrow when users send several.")


def srm_section(view: View, units) -> None:
    if view.config is None:
        st.caption("Sample-ratio check skipped: no definition for this experiment.")
        return
    if units is None or units.empty:
        st.caption("Sample-ratio check not computed: no per-user data for this range.")
        return
    srm = processing.srm_for(units, view.config)
    if srm.mismatch:
        st.warning(f"Sample ratio mismatch: users per arm {srm.observed} do not match the configured "
                   f"split (chi² = {srm.chi2:.1f}, p = {srm.p_value:.2g}). Check assignment before "
                   "trusting the comparison.")
    elif srm.status == "ok":
        st.caption(f"Sample-ratio check passed on users per arm {srm.observed} (p = {srm.p_value:.3f}).")
    else:
        st.caption(f"Sample-ratio check not computed: {srm.detail}.")
