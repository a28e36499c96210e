"""Pushing a change from the control panel: the admin-token gate, the version the operator
loaded, and the audit-from-topic reload."""
from __future__ import annotations

import hmac

import streamlit as st

from dashboard import data
from dashboard.control import publishing
from dashboard.sections.common import View


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
