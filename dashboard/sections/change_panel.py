"""The control panel's change section: a threshold (arm or intent cluster, direct or canary)
with its what-if preview, a multi arm's score floor / answer margin, feedback invalidation."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from cache_core.decision.thresholds import threshold_for
from cache_core.events import now_ms
from dashboard import charts, data
from dashboard.control import (changes, processing, queries, rollout, shadow_estimates, tuning, tuning_multi,
                               whatif)
from dashboard.control.stats import DEFAULT_ALPHA
from dashboard.control.canary import last_failed_try, rolled_back_canaries
from dashboard.sections.actions import act_and_reload
from dashboard.sections.common import View, optional
from dashboard.sections.tuning_panel import logged_history, page_guardrails


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
                    disabled=cluster is not None, help="A canary applies to the whole arm. A lower threshold "
                                                       "always goes out as a canary.")
    route = rollout.panel_threshold_rollout(current, threshold, cluster, mode)
    rollout_note(route)
    share, target = 0.1, view.settings.dashboard.target_false_hit_rate
    if route.route == "canary":
        c1, c2 = st.columns(2)
        share = c1.number_input("Canary share of the arm's units", 0.01, 1.0, 0.1, 0.01, key="ctl_canary_share")
        target = c2.number_input("Roll back above false-hit rate", 0.001, 0.5, float(target), 0.005,
                                 format="%.3f", key="ctl_canary_target")
    reason = st.text_input("Reason", key="ctl_reason")
    if st.button("Push", type="primary", key="ctl_push", disabled=route.route == "refused"):
        if cluster is not None:
            change = lambda: changes.set_cluster_threshold(arm, cluster, threshold)
            what = f"{arm} cluster {cluster} threshold {threshold:.3f}"
        elif route.route == "canary":
            change = lambda: changes.start_canary(arm, threshold, share, target, at_ms=now_ms())
            what = f"{arm} canary at {threshold:.3f} on {share:.0%} of units"
        else:
            change = lambda: changes.set_threshold(arm, threshold)
            what = f"{arm} threshold {threshold:.3f}"
        act_and_reload(view, change, audit_reason(route, [reason]), what)
    if config.arm(arm).similarity == "multi":
        multi_push_section(view, config, arm)
    invalidation_push_section(view, config, arm)


def rollout_note(route: rollout.Rollout) -> None:
    """Why a push goes out other than as picked (``rollout``): a loosening as a canary, or refused."""
    if route.route == "refused":
        st.warning(f"Not pushable: {route.reason}.")
    elif route.reason:
        st.info(f"{route.reason[0].upper()}{route.reason[1:]}.")


def audit_reason(route: rollout.Rollout, parts: list[str]) -> str:
    """The audit row's reason: what moved and the operator's words, and that a loosening went
    out as a canary although "direct" was picked."""
    parts = [p.strip() for p in parts if p.strip()]
    if route.reason:
        parts.append("a loosening: pushed as a canary")
    return "; ".join(parts)


def invalidation_push_section(view: View, config, arm: str) -> None:
    """How many users' "wrong" verdicts take an entry of the arm out of service (cache_core.state.feedback)."""
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
                         "promoted or rolled back. A lower floor or margin always goes out as a canary.")
    route = rollout.panel_multi_rollout(multi.threshold, multi.answer_margin, floor, margin, mode)
    rollout_note(route)
    share, target = 0.1, view.settings.dashboard.target_false_hit_rate
    if route.route == "canary":
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
        if route.route == "canary":
            change = lambda: changes.start_multi_canary(arm, share, target, now_ms(), **changed)
            what = f"{arm} canary with score floor {floor:.3f}, answer margin {margin:.3f} on {share:.0%} of units"
        else:
            change = lambda: changes.set_multi(arm, score_floor=floor, answer_margin=margin)
            what = f"{arm} score floor {floor:.3f}, answer margin {margin:.3f}"
        act_and_reload(view, change, audit_reason(route, [*moved, reason]), what)


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
            f"{pct(rec.current_hit_rate)}), false-hit rate {pct(rec.false_hit_rate)} with time-uniform 95% upper bound "
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
    shadow_whatif(view, scoped[scoped["arm"] == arm], arm, cluster, threshold)
    curve = whatif.drop_unreplayable(whatif.whatif_curve(scoped), scoped)
    st.altair_chart(charts.whatif_curve(curve, threshold), use_container_width=True)
    st.caption("First-order estimate from logged top-1 similarities: it holds the cache contents fixed.")
    rule = next((r for r in rules if r.arm == arm), None)
    if rule is not None:
        multi_whatif_notes(view, rule, scoped[scoped["arm"] == arm], threshold)
        margin_whatif(view, rule, hist[hist["arm"] == arm], rules)


def shadow_whatif(view: View, arm_hist, arm: str, cluster: int | None, threshold: float) -> None:
    """The false-hit estimate at ``threshold`` from shadow verdicts (hit and near-miss checks), apart
    from the users'; below the current threshold it rests on near-miss checks only shadows give."""
    shadow = optional(view, "shadow_labelled", view.filters)
    if shadow is None or shadow.empty:
        return
    mine = tuning.narrow(shadow, arm, cluster)
    row = shadow_estimates.shadow_table(arm_hist, mine, [threshold], DEFAULT_ALPHA).iloc[0]
    if not row["shadow_supported"]:
        st.caption(f"Shadow checks: no estimate at {threshold:.3f} ({row['shadow_labelled']} verdicts reach it; "
                   "near-miss checks do not reach this low, or a part has none).")
        return
    st.caption(f"Shadow checks' estimate at {threshold:.3f}: false-hit rate {row['shadow_false_hit_rate']:.1%}, "
               f"95% upper bound {row['shadow_false_hit_upper']:.1%}, from {row['shadow_hit_checks']} checked hits "
               f"and {row['shadow_near_miss_checks']} checked near-misses (misses judged as if served). It rests on "
               "shadow verdicts only, never pooled with the users' above.")


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
            "false_hit_upper": pct("false-hit upper (time-uniform)")})
        st.caption(f"Current margin {rule.answer_margin:.3f}, score floor {rule.score_floor:.3f}. Exact replay of "
                   "the logged scores at the logged cosine gates, guards aside; the false-hit rate counts the "
                   "labelled hits each margin would still serve; its upper bound is the time-uniform one auto-tune "
                   "decides with, 95% split over the margins shown. supported=false: that margin would serve "
                   "decisions no label covers.")
