"""The dashboard in a real headless Chromium: `streamlit run` on a seeded warehouse.

Playwright drives Debian's chromium (``executable_path``; no browser download). Streamlit renders
client-side over a websocket, so each test waits until the Altair chart is drawn, checks the DOM for
the chart and the arm names, and keeps a screenshot under tests/artifacts/ for a human to look at.
A failing test also leaves a Playwright trace there (``playwright show-trace`` opens it) and a
screenshot of the page as it was.
"""
from __future__ import annotations

import shutil
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from playwright.sync_api import Page, sync_playwright

from cache_core.chclient import connect
from cache_core.publish.control_topic import read_latest_configs
from cache_core.settings import KafkaSettings
from infra.kafka.topics import ensure_topics
from infra.runtime import REPO_ROOT, free_port, spawn, wait_until
from tests.fixtures import dashboard_seed as seed

pytestmark = pytest.mark.e2e
ARTIFACTS = REPO_ROOT / "tests" / "artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
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


@pytest.fixture(scope="module")
def chromium():
    """Debian's chromium under Playwright, once for the module."""
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture()
def page(chromium, dashboard, request):
    """A fresh page on the dashboard, traced; on failure the trace and a screenshot stay in tests/artifacts/."""
    context = chromium.new_context(viewport={"width": 1400, "height": 2600})
    context.tracing.start(screenshots=True, snapshots=True)
    page = context.new_page()
    page.goto(dashboard[0])
    failed_before = request.session.testsfailed
    try:
        yield page
    finally:
        name = request.node.name.replace("/", "_")
        if request.session.testsfailed > failed_before:  # the call's report is counted before teardown
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=ARTIFACTS / f"failed-{name}.png", full_page=True)
            context.tracing.stop(path=ARTIFACTS / f"trace-{name}.zip")
        else:
            context.tracing.stop()
        context.close()


def wait_for(page: Page, expression: str, timeout_s: float) -> None:
    """Until a JavaScript boolean expression holds (polled in the page)."""
    page.wait_for_function(expression, timeout=timeout_s * 1000, polling=500)


def screenshot(page: Page, path: Path) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=path, full_page=True)
    return path


def test_page_renders_chart_and_arms(dashboard, page):
    url, experiment_id, service = dashboard
    wait_for(page, CHART_DRAWN, timeout_s=90)
    dom = page.content()
    shot = screenshot(page, ARTIFACTS / "dashboard.png")
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


@pytest.mark.parametrize("title,marker,shot", [
    ("Time series", "dashed lines mark threshold changes", "dashboard-timeseries.png"),
    ("Attribution", "Kitagawa", "dashboard-attribution.png"),
])
def test_page_draws_its_charts(dashboard, page, title, marker, shot):
    _, _, service = dashboard
    wait_for(page, CHART_DRAWN, timeout_s=90)
    assert page.evaluate(OPEN_PAGE % title)
    wait_for(page, f"document.body.innerText.includes({marker!r})", 30)
    wait_for(page, VISIBLE_CHART, 30)
    time.sleep(1.5)  # let vega finish its transition before the picture
    screenshot(page, ARTIFACTS / shot)
    assert "Traceback" not in page.content(), service.log_path.read_text()[-2000:]
    if title == "Time series":  # every time label once (Vega's own ticks printed minutes twice)
        labels = page.evaluate(TIME_AXIS_LABELS)
        assert labels and len(labels) == len(set(labels)), labels


def test_threshold_push_from_the_browser_reaches_the_control_topic(dashboard, control_kafka, page):
    _, experiment_id, service = dashboard
    wait_for(page, CHART_DRAWN, timeout_s=90)
    assert page.evaluate(OPEN_PAGE % "Control panel")
    wait_for(page, "document.querySelector('input[aria-label=\"Your name\"]') !== null", 30)
    wait_for(page, VISIBLE_CHART, 30)
    assert page.evaluate(SET_INPUT % ("Your name", "browser-test"))
    time.sleep(1)
    # A tighter threshold goes out directly (a looser one would go out as a canary: rollout.py).
    assert page.evaluate(SET_INPUT % ("New threshold", "0.950"))
    time.sleep(1.5)
    screenshot(page, ARTIFACTS / "dashboard-control.png")
    assert page.evaluate(CLICK_BUTTON % "Push")
    wait_for(page, "document.body.innerText.includes('as config version 2')", 60)
    wait_for(page, VISIBLE_CHART, 30)
    time.sleep(3)  # the page re-runs after a push; let its tables and charts settle
    screenshot(page, ARTIFACTS / "dashboard-control-pushed.png")
    pushed = read_latest_configs(control_kafka)[experiment_id]
    assert pushed.experiment.version == 2 and pushed.actor == "browser-test"
    assert pushed.experiment.arm("control").threshold == pytest.approx(0.95)
