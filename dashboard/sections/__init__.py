"""What the pages draw, one module per page (the control panel's in three), on top of
``dashboard.control`` (statistics, tuning, publishing, queries), ``dashboard.data``
(cached query results) and ``dashboard.charts``. Streamlit lives here and in the pages only."""
