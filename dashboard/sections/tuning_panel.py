"""The control panel's canary and auto-tune sections (guardrails, recommendations, schedule)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import pandas as pd
import streamlit as st

from cache_core.decision.thresholds import multi_for
from cache_core.events import now_ms
from dashboard import charts, data
from dashboard.control import autotune, canary_gain, changes, queries, rollout, tuning, tuning_judge
from dashboard.control.canary import configs_by_version, evaluate_canary, last_failed_try, rolled_back_canaries
from dashboard.control.guardrails import Guardrails
from dashboard.control.stats import ProportionStat
from dashboard.sections.actions import act, act_and_reload, authorized
from dashboard.sections.common import View, optional


def logged_history(view: View, config) -> tuple[pd.DataFrame, dict]:
    """The experiment's audit rows and every config version they, the file and ``config`` know."""
    history = data.run(view.settings, "change_history", view.experiment_id)
    return history, configs_by_version(history, data.file_configs(view.settings).get(view.experiment_id),
                                              config)


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
        if decision.action == "promote" and canary_gain.loosens(arm):  # as auto-tune judges it
            units = optional(view, "canary_unit_stats", view.experiment_id, arm.name, arm.canary.started_at_ms)
            decision = canary_gain.gate_promotion(decision, arm, units, alpha=0.05)
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
    shadow = optional(view, "shadow_labelled", view.filters)
    shadow = None if shadow is None or shadow.empty else shadow
    recs = tuning.recommend_all(config, hist, labelled, guardrails, now_ms=now_ms(), last_change_ms=last_ms,
                                clusters=per_cluster, shadow_labelled=shadow)
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
              "labels": r.labelled, "shadow verdicts": r.shadow_labelled, "rests on": r.basis or "—",
              "why": r.reason} for r in recs])
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
        st.caption("Recommended: the highest estimated hit rate whose 95% upper bound of the false-hit rate "
                   "(labelled hits at or above the threshold, from decisions logged at or below it) stays under the "
                   "target. The bound holds over every re-run and all candidates at once (a Beta-mixture confidence "
                   "sequence, alpha split over the candidates). The hit rate is replayed with the cache contents "
                   "held fixed and labels are taken as a random sample of hits: try changes as a canary, whose "
                   "measured false-hit rate decides.")
        if shadow is not None:
            st.caption("With shadow checks, each candidate also has a shadow estimate, never pooled with the users' "
                       "(each at half the alpha): served hits' checks and near-miss checks (misses just below the "
                       "threshold, judged as if served), weighted by how many decisions each part holds. Near-miss "
                       "verdicts reach below the current threshold, where users have no labels: \"rests on: shadow\" "
                       "marks a recommendation only they support. A source that measures a candidate over the "
                       "target vetoes it.")
    judge_cuts(view, config, guardrails)
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
        for r in to_apply:  # the routes auto-tune takes: every loosening through a canary, or refused
            share = shares.explore if r.action == "explore" else shares.change
            route = rollout.threshold_rollout(r, share)
            if route.route == "refused":  # shown after the re-run, at the top of the panel
                earlier = st.session_state.get("ctl_flash_warning")
                st.session_state["ctl_flash_warning"] = " ".join(filter(None, [earlier,
                                                                              f"Not applied: {route.reason}."]))
                continue
            if route.route == "canary":
                change = lambda r=r, share=share: changes.start_canary(r.arm, r.recommended, share,
                                                                      guardrails.target_false_hit_rate,
                                                                      at_ms=now_ms())
            elif r.cluster is not None:
                change = lambda r=r: changes.set_cluster_threshold(r.arm, r.cluster, r.recommended)
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


def judge_cuts(view: View, config, guardrails: Guardrails) -> None:
    """Judged arms: the recommended probability cut (``tuning_judge``), what auto-tune would push."""
    if not any(arm.judge is not None for arm in config.arms):
        return
    probabilities = optional(view, "judge_probabilities", view.filters)
    if probabilities is None:
        return
    recs = tuning_judge.recommend_cuts(
        config, probabilities, guardrails, now_ms=now_ms(),
        cut_of=lambda judge: tuning_judge.current_cut(judge, view.settings.cache.judge_dir),
        last_change_ms=queries.last_change_ms(data.run(view.settings, "last_changes", view.experiment_id)))
    st.markdown("**Judged arms: the judge's operating point**")
    st.dataframe(pd.DataFrame([{"arm": r.arm, "judge": r.version, "current cut": r.current,
                                "recommended": r.recommended, "action": r.action,
                                "share served now": r.current_hit_rate, "then": r.recommended_hit_rate,
                                "false-hit upper bound": r.false_hit_upper, "labels": r.labelled,
                                "shadow verdicts": r.shadow_labelled, "rests on": r.basis or "—", "why": r.reason}
                               for r in recs]), hide_index=True, column_config={
        "share served now": st.column_config.NumberColumn(format="percent"),
        "then": st.column_config.NumberColumn(format="percent"),
        "false-hit upper bound": st.column_config.NumberColumn(format="percent")})
    st.caption("A judged decision logs the judge's probability, so another cut replays exactly (same floor and "
               "candidates). Users label only hits, so a lower cut rests on shadow checks of the judge's vetoes; "
               "the same bound as for thresholds. Auto-tune tries a lower cut on a canary and pushes a higher one "
               "directly. Shares are of the decisions that reached the judge.")


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
