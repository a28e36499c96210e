"""scache dashboard: the control panel (thresholds, canaries, auto-tune, history and rollback)."""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run by Streamlit as a page script: the repo root may not be on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dashboard.sections.common import start_page
from dashboard.sections.control_panel import control_panel


def main() -> None:
    view = start_page("scache — Control panel")
    if view is not None:
        control_panel(view)


main()
