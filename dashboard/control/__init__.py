"""The experiment control plane, free of any UI: statistics, what-if replays, tuning rules,
canary verdicts, the auto-tune daemon (``python -m dashboard.control.autotune``), config
publishing and the warehouse queries they read. The Streamlit pages use this package;
nothing here imports Streamlit or the pages."""
