"""The dashboard in a real headless Chromium: `streamlit run` on a seeded warehouse.

Streamlit renders client-side over a websocket, so the page is driven over the
DevTools protocol (tests/e2e/cdp.py): wait until the Altair chart is drawn, check
the DOM for the chart and the arm names, and keep a screenshot under
tests/artifacts/ for a human to look at.
"""
from __future__ import annotations

import sys
import urllib.request
import uuid
from pathlib import Path

import pytest

from cache_core.chclient import connect
from infra.runtime import REPO_ROOT, free_port, spawn, wait_until
from tests.e2e.cdp import CHROMIUM, Chromium
from tests.fixtures import dashboard_seed as seed

pytestmark = pytest.mark.e2e
ARTIFACTS = REPO_ROOT / "tests" / "artifacts"
CHART_DRAWN = ("document.querySelectorAll('.vega-embed canvas, .vega-embed svg').length > 0 && "
               "document.body.innerText.includes('treatment')")

OPEN_TAB = ("(() => { const tab = Array.from(document.querySelectorAll('[role=tab]'))"
            ".find(t => t.innerText.trim() === %r); if (tab) tab.click(); return !!tab; })()")


@pytest.fixture(scope="module")
def dashboard(warehouse, ch_settings, tmp_path_factory):
    """`streamlit run dashboard/app.py` on a free port against a freshly seeded experiment."""
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    tmp = tmp_path_factory.mktemp("dashboard")
    experiment_id = f"browser-{uuid.uuid4().hex[:6]}"
    client = connect(ch_settings)
    seed.seed(client, experiment_id)
    client.close()
    port = free_port()
    env = {
        "SCACHE_CLICKHOUSE__URL": ch_settings.url,
        "SCACHE_CLICKHOUSE__DATABASE": ch_settings.database,
        "SCACHE_EXPERIMENTS_FILE": str(seed.experiments_file(tmp / "experiments.yaml", experiment_id)),
        "PYTHONPATH": str(REPO_ROOT),
    }
    cmd = [sys.executable, "-m", "streamlit", "run", str(REPO_ROOT / "dashboard" / "app.py"),
           "--server.address", "127.0.0.1", "--server.port", str(port), "--server.headless", "true",
           "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
    service = spawn("dashboard", cmd, tmp / "dashboard.log", env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200,
                   timeout_s=90, what="dashboard", proc=service.proc, log_path=service.log_path)
        yield url, experiment_id, service
    finally:
        service.stop()


def test_page_renders_chart_and_arms(dashboard, tmp_path):
    url, experiment_id, service = dashboard
    with Chromium(url, tmp_path / "profile") as browser:
        browser.wait_for(CHART_DRAWN, timeout_s=90)
        dom = browser.dom()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = browser.screenshot(ARTIFACTS / "dashboard.png")
    assert experiment_id in dom
    assert "control" in dom and "treatment" in dom
    assert "vega-embed" in dom
    assert "No data yet" not in dom
    assert "Traceback" not in dom, service.log_path.read_text()[-2000:]
    assert shot.stat().st_size > 20_000  # a blank page is a few KB


def test_time_series_tab_draws_line_chart(dashboard, tmp_path):
    url, _, _ = dashboard
    with Chromium(url, tmp_path / "profile") as browser:
        browser.wait_for(CHART_DRAWN, timeout_s=90)
        assert browser.evaluate(OPEN_TAB % "Time series")
        browser.wait_for("document.body.innerText.includes('dashed lines mark threshold changes')", 30)
        browser.wait_for("Array.from(document.querySelectorAll('.vega-embed'))"
                         ".some(e => e.offsetParent !== null && e.querySelector('canvas, svg'))", 30)
        browser.screenshot(ARTIFACTS / "dashboard-timeseries.png")
