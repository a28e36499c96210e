"""scache dashboard: a metric per arm over time, threshold changes marked."""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run by Streamlit as a page script: the repo root may not be on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import streamlit as st

from dashboard.sections.time_series import time_series
from dashboard.sections.common import refresh_every, start_page


def main() -> None:
    view = start_page("scache — Time series")
    if view is not None:
        st.fragment(time_series, run_every=refresh_every(view))(view)


main()
