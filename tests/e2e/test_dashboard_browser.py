"""The dashboard in a real headless Chromium: `streamlit run` on a seeded warehouse.

Streamlit renders client-side over a websocket, so the page is driven over the
DevTools protocol (tests/e2e/cdp.py): wait until the Altair chart is drawn, check
the DOM for the chart and the arm names, and keep a screenshot under
tests/artifacts/ for a human to look at.
"""
from __future__ import annotations

import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from cache_core.chclient import connect
from cache_core.publish.control_topic import read_latest_configs
from cache_core.settings import KafkaSettings
from infra.kafka.topics import ensure_topics
from infra.runtime import REPO_ROOT, free_port, spawn, wait_until
from tests.e2e.cdp import CHROMIUM, Chromium
from tests.fixtures import dashboard_seed as seed

pytestmark = pytest.mark.e2e
ARTIFACTS = REPO_ROOT / "tests" / "artifacts"
CHART_DRAWN = ("document.querySelectorAll('.vega-embed canvas, .vega-embed svg').length > 0 && "
               "document.body.innerText.includes('treatment')")

# Streamlit multipage: the sidebar's page links (client-side navigation, same session).
OPEN_PAGE = ("(() => { const link = Array.from(document.querySelectorAll('[data-testid=stSidebarNavLink]'))"
             ".find(a => a.innerText.trim() === %r); if (link) link.click(); return !!link; })()")


@pytest.fixture(scope="module")
def control_kafka(kafka_broker):
    """A control topic of this module's own on the session broker."""
    suffix = uuid.uuid4().hex[:8]
    settings = KafkaSettings(bootstrap_servers=kafka_broker.info["bootstrap"], events_topic=f"e2e.events.{suffix}",
                             control_topic=f"e2e.control.{suffix}", feedback_topic=f"e2e.feedback.{suffix}")
    ensure_topics(settings)
    return settings


@pytest.fixture(scope="module")
def dashboard(warehouse, ch_settings, control_kafka, tmp_path_factory):
    """`streamlit run dashboard/Home.py` on a free port against a freshly seeded experiment."""
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    tmp = tmp_path_factory.mktemp("dashboard")
    experiment_id = f"browser-{uuid.uuid4().hex[:6]}"
    client = connect(ch_settings)
    now = seed.seed(client, experiment_id)
    seed.seed_tuning(client, experiment_id, now)  # feedback labels: false-hit rates and auto-tune
    client.close()
    port = free_port()
    env = {
        "SCACHE_CLICKHOUSE__URL": ch_settings.url,
        "SCACHE_CLICKHOUSE__DATABASE": ch_settings.database,
        "SCACHE_EXPERIMENTS_FILE": str(seed.experiments_file(tmp / "experiments.yaml", experiment_id)),
        "SCACHE_KAFKA__BOOTSTRAP_SERVERS": control_kafka.bootstrap_servers,
        "SCACHE_KAFKA__CONTROL_TOPIC": control_kafka.control_topic,
        "PYTHONPATH": str(REPO_ROOT),
    }
    cmd = [sys.executable, "-m", "streamlit", "run", str(REPO_ROOT / "dashboard" / "Home.py"),
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
    with Chromium(url, tmp_path / "profile", height=2600) as browser:
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


VISIBLE_CHART = ("Array.from(document.querySelectorAll('.vega-embed'))"
                 ".some(e => e.offsetParent !== null && e.querySelector('canvas, svg'))")
# React-controlled inputs: set through the native setter so React sees the change, then blur to commit.
SET_INPUT = ("(() => { const el = document.querySelector(`input[aria-label=\"%s\"]`); if (!el) return false;"
             " const set = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set;"
             " el.focus(); set.call(el, '%s'); el.dispatchEvent(new Event('input', {bubbles: true}));"
             " el.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', bubbles: true})); el.blur(); return true; })()")
TIME_AXIS_LABELS = ("Array.from(document.querySelectorAll('.vega-embed g.role-axis'))"
                    ".filter(a => (a.getAttribute('aria-label') || '').startsWith('X-axis'))"
                    ".flatMap(a => Array.from(a.querySelectorAll('g.role-axis-label text')).map(t => t.textContent))")
CLICK_BUTTON = ("(() => { const b = Array.from(document.querySelectorAll('button'))"
                ".find(b => b.innerText.trim() === %r && b.offsetParent !== null); if (b) b.click(); return !!b; })()")


@pytest.mark.parametrize("page,marker,shot", [
    ("Time series", "dashed lines mark threshold changes", "dashboard-timeseries.png"),
    ("Attribution", "Kitagawa", "dashboard-attribution.png"),
])
def test_page_draws_its_charts(dashboard, tmp_path, page, marker, shot):
    url, _, service = dashboard
    with Chromium(url, tmp_path / "profile", height=2600) as browser:
        browser.wait_for(CHART_DRAWN, timeout_s=90)
        assert browser.evaluate(OPEN_PAGE % page)
        browser.wait_for(f"document.body.innerText.includes({marker!r})", 30)
        browser.wait_for(VISIBLE_CHART, 30)
        time.sleep(1.5)  # let vega finish its transition before the picture
        browser.screenshot(ARTIFACTS / shot)
        assert "Traceback" not in browser.dom(), service.log_path.read_text()[-2000:]
        if page == "Time series":  # every time label once (Vega's own ticks printed minutes twice)
            labels = browser.evaluate(TIME_AXIS_LABELS)
            assert labels and len(labels) == len(set(labels)), labels


def test_threshold_push_from_the_browser_reaches_the_control_topic(dashboard, control_kafka, tmp_path):
    url, experiment_id, service = dashboard
    with Chromium(url, tmp_path / "profile", height=2600) as browser:
        browser.wait_for(CHART_DRAWN, timeout_s=90)
        assert browser.evaluate(OPEN_PAGE % "Control panel")
        browser.wait_for("document.querySelector('input[aria-label=\"Your name\"]') !== null", 30)
        browser.wait_for(VISIBLE_CHART, 30)
        assert browser.evaluate(SET_INPUT % ("Your name", "browser-test"))
        time.sleep(1)
        assert browser.evaluate(SET_INPUT % ("New threshold", "0.850"))
        time.sleep(1.5)
        browser.screenshot(ARTIFACTS / "dashboard-control.png")
        assert browser.evaluate(CLICK_BUTTON % "Push")
        browser.wait_for("document.body.innerText.includes('as config version 2')", 60)
        browser.wait_for(VISIBLE_CHART, 30)
        time.sleep(3)  # the page re-runs after a push; let its tables and charts settle
        browser.screenshot(ARTIFACTS / "dashboard-control-pushed.png")
    pushed = read_latest_configs(control_kafka)[experiment_id]
    assert pushed.experiment.version == 2 and pushed.actor == "browser-test"
    assert pushed.experiment.arm("control").threshold == pytest.approx(0.85)
