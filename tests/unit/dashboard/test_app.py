"""The Streamlit app without services: every page must explain, not crash, when ClickHouse is away."""
import pytest
from streamlit.testing.v1 import AppTest

from cache_core.settings import get_settings
from infra.runtime import REPO_ROOT, free_port

APP = str(REPO_ROOT / "dashboard" / "Home.py")
PAGES = sorted(p.relative_to(REPO_ROOT / "dashboard").as_posix() for p in (REPO_ROOT / "dashboard" / "pages").glob("*.py"))


@pytest.fixture
def unreachable_warehouse(monkeypatch):
    monkeypatch.setenv("SCACHE_CLICKHOUSE__URL", f"http://127.0.0.1:{free_port()}")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_unreachable_warehouse_shows_error_not_traceback(unreachable_warehouse):
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert any("Cannot read from ClickHouse" in e.value for e in at.error)
    assert at.title[0].value.startswith("scache")


def test_every_page_says_so_too(unreachable_warehouse):
    assert PAGES == ["pages/01_Time_series.py", "pages/02_Attribution.py", "pages/03_Control_panel.py"]
    at = AppTest.from_file(APP, default_timeout=60).run()
    for page in PAGES:
        at.switch_page(page).run()
        assert not at.exception, (page, at.exception)
        assert any("Cannot read from ClickHouse" in e.value for e in at.error), page
        assert at.title[0].value.startswith("scache"), page
