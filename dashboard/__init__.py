"""Streamlit dashboard: attribution views, A/B statistics and the control panel."""
