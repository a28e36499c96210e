"""scache dashboard, home page: per-arm overview with the A/B statistics.

Run: ``streamlit run dashboard/Home.py --server.address 127.0.0.1 --server.port P --server.headless true``.
Streamlit multipage: this page and ``pages/NN_Name.py`` (time series, attribution, control
panel), each a thin ``main()``; what they draw is in ``dashboard/sections/``, the statistics,
tuning, queries and publishing in ``dashboard/control/``. Settings come from ``SCACHE_*``
variables (cache_core.settings).
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # `streamlit run dashboard/Home.py` puts dashboard/ first on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import streamlit as st

from dashboard.sections.common import refresh_every, start_page
from dashboard.sections.overview import overview


def main() -> None:
    view = start_page()
    if view is not None:
        st.fragment(overview, run_every=refresh_every(view))(view)


main()
