"""The control panel: reload, change, canaries, auto-tune, history and rollback."""
from __future__ import annotations

import streamlit as st

from dashboard import data
from dashboard.control import changes
from dashboard.sections.actions import act_and_reload, audit_from_topic
from dashboard.sections.change_panel import change_section
from dashboard.sections.common import View
from dashboard.sections.tuning_panel import autotune_section, canary_section


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
