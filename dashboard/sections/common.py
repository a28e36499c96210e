"""Shared by every page: the sidebar filters (``View``), the page header, optional queries."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import streamlit as st

from cache_core.experiments import ExperimentConfig
from cache_core.settings import Settings, get_settings
from dashboard import data
from dashboard.control import processing
from dashboard.control.queries import Filters

ALL_NAMESPACES = "(all namespaces)"
NO_DATA = "No data yet for this experiment and time range — traffic shows up here once the attribution job writes its first window."


@dataclass(frozen=True)
class View:
    """What the sidebar picked, and the experiment's definition (None: it only appears in the data)."""

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


FILTER_KEYS = ("experiment", "time_range", "namespace", "auto_refresh")
"""The sidebar's widget keys: every page draws the same sidebar and keeps what was picked."""


def start_page(title: str = "scache — semantic cache experiments") -> View | None:
    """Page config, title, the sidebar and the range caption; None when there is nothing to show
    (the sidebar said why). Streamlit drops a widget's state when a page without it runs, so the
    filters picked on one page are carried to the next by re-assigning them first."""
    st.set_page_config(page_title="scache", layout="wide")
    for key in FILTER_KEYS:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]
    settings = get_settings()
    st.title(title)
    view = sidebar(settings)
    if view is None:
        return None
    f = view.filters
    st.caption(f"{f.experiment_id} · {f.namespace or 'all namespaces'} · "
               f"{f.start:%Y-%m-%d %H:%M} – {f.end:%Y-%m-%d %H:%M} UTC")
    return view


def refresh_every(view: View) -> float | None:
    """The auto-refresh period of the page's fragments (None: off)."""
    return view.settings.dashboard.refresh_s if st.session_state.get("auto_refresh") else None
