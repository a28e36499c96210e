"""The attribution page's "By store tier" section, on aggregates given in place of the warehouse."""
from __future__ import annotations

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import charts, data
from dashboard.control import queries

WIDE = pd.DataFrame({"arm": ["control", "treatment"], "requests": [200, 100],
                     "hits_memory": [60, 20], "hits_disk": [0, 30]})


def tier_page():
    from cache_core.settings import get_settings
    from dashboard.sections.attribution import tier_section
    from dashboard.sections.common import View

    tier_section(View(get_settings(), "exp", "Last hour", None, None))


@pytest.fixture
def warehouse(monkeypatch):
    """``data.run`` answering the tier query from ``answer[0]`` (queries.tier_frame of it)."""
    answer = [WIDE]
    asked = []

    def run(settings, name, *args):
        asked.append(name)
        assert name == "tier_hit_rates"
        return queries.tier_frame(answer[0])

    monkeypatch.setattr(data, "run", run)
    return answer, asked


def test_tier_frame_splits_each_arms_hit_rate_by_tier():
    frame = queries.tier_frame(WIDE)
    assert list(frame.columns) == ["arm", "tier", "requests", "hits", "hit_rate"]
    rates = {(r.arm, r.tier): r.hit_rate for r in frame.itertuples()}
    assert rates == {("control", "memory"): 0.3, ("control", "disk"): 0.0,
                     ("treatment", "memory"): 0.2, ("treatment", "disk"): 0.3}
    # The tiers add up to the arm's hit rate.
    assert frame.groupby("arm")["hits"].sum().to_dict() == {"control": 60, "treatment": 50}
    assert queries.tier_frame(WIDE.iloc[:0]).empty


def test_tier_chart_stacks_tiers_per_arm():
    spec = charts.tier_hit_rates(queries.tier_frame(WIDE)).to_dict()
    assert spec["mark"]["type"] == "bar"
    assert spec["encoding"]["x"]["field"] == "arm" and spec["encoding"]["color"]["field"] == "tier"
    assert spec["encoding"]["y"]["stack"] == "zero"


def test_section_draws_hit_rate_by_tier(warehouse):
    _, asked = warehouse
    at = AppTest.from_function(tier_page, default_timeout=60).run()
    assert not at.exception
    assert [s.value for s in at.subheader] == ["By store tier"]
    assert at.get("vega_lite_chart"), "no chart"
    assert any("disk tier" in c.value for c in at.caption)
    assert asked == ["tier_hit_rates"]


def test_section_without_hits_says_so(warehouse):
    answer, _ = warehouse
    answer[0] = WIDE.assign(hits_memory=0, hits_disk=0)
    at = AppTest.from_function(tier_page, default_timeout=60).run()
    assert not at.exception
    assert not at.get("vega_lite_chart")
    assert any("No hits" in i.value for i in at.info)
