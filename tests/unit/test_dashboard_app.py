"""The Streamlit app without services: it must explain, not crash, when ClickHouse is away."""
import pytest
from streamlit.testing.v1 import AppTest

from cache_core.settings import get_settings
from infra.runtime import REPO_ROOT, free_port

APP = str(REPO_ROOT / "dashboard" / "app.py")


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
