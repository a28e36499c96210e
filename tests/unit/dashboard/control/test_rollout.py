"""dashboard.control.rollout: every loosening goes out through a sequentially tested canary
or is refused with the reason (issue 26 (b)); tightening may go out directly."""
import pytest

from dashboard.control.rollout import (multi_loosens, multi_rollout, panel_multi_rollout, panel_threshold_rollout,
                                      threshold_rollout)
from dashboard.control.tuning import Recommendation
from dashboard.control.tuning_multi import MultiRecommendation


def _rec(current, recommended, action="change", cluster=None):
    return Recommendation("control", cluster, current, recommended, action, "why")


def _multi(floor, margin, new_floor, new_margin, action="change"):
    return MultiRecommendation("m", floor, margin, new_floor, new_margin, action, "why")


@pytest.mark.parametrize("rec, share, route", [
    (_rec(0.90, 0.87), 0.1, "canary"),             # arm loosening: on a canary
    (_rec(0.90, 0.93), 0.1, "canary"),             # arm raise: canary as before
    (_rec(0.90, 0.87, "explore"), 0.1, "canary"),
    (_rec(0.90, 0.93), 0.0, "direct"),             # --canary-share 0: a raise goes out directly
    (_rec(0.90, 0.87), 0.0, "refused"),            # ... a lower threshold never does
    (_rec(0.90, 0.93, cluster=3), 0.1, "direct"),  # cluster raise: directly
    (_rec(0.90, 0.87, cluster=3), 0.1, "refused"),  # cluster loosening: no canary of one cluster
    (_rec(0.90, 0.87, cluster=3), 0.0, "refused"),
    (_rec(0.90, 0.90, "hold"), 0.1, "none"),
    (_rec(0.90, None, "hold"), 0.0, "none"),
])
def test_threshold_routes(rec, share, route):
    assert threshold_rollout(rec, share).route == route


def test_refusals_say_why():
    cluster = threshold_rollout(_rec(0.90, 0.87, cluster=3), 0.1).reason
    assert "cluster 3" in cluster and "0.900 -> 0.870" in cluster and "canary" in cluster
    assert "--canary-share is 0" in threshold_rollout(_rec(0.90, 0.87), 0.0).reason
    multi = multi_rollout(_multi(0.55, 0.01, 0.55, 0.005), 0.0).reason
    assert "answer margin 0.010 -> 0.005" in multi and "score floor" not in multi and "canary share is 0" in multi


@pytest.mark.parametrize("rec, share, route", [
    (_multi(0.55, 0.01, 0.58, 0.01), 0.1, "direct"),    # raise the floor: directly
    (_multi(0.55, 0.01, 0.58, 0.02), 0.0, "direct"),
    (_multi(0.55, 0.01, 0.52, 0.01), 0.1, "canary"),    # lower floor: canary (was pushed directly)
    (_multi(0.55, 0.01, 0.58, 0.005), 0.1, "canary"),   # one of the two lower is a loosening
    (_multi(0.55, 0.01, 0.52, 0.01), 0.0, "refused"),
    (_multi(0.55, 0.01, 0.52, 0.01, "explore"), 0.1, "canary"),
    (_multi(0.55, 0.01, None, None, "hold"), 0.1, "none"),
])
def test_multi_routes(rec, share, route):
    assert multi_rollout(rec, share).route == route


def test_multi_loosens():
    assert multi_loosens(_multi(0.55, 0.01, 0.52, 0.01)) and multi_loosens(_multi(0.55, 0.01, 0.55, 0.0))
    assert not multi_loosens(_multi(0.55, 0.01, 0.55, 0.01)) and not multi_loosens(_multi(0.55, 0.01, 0.6, 0.02))


@pytest.mark.parametrize("current, new, cluster, mode, route", [
    (0.80, 0.75, None, "direct", "canary"),    # a lower arm threshold typed as direct: a canary anyway
    (0.80, 0.75, None, "canary", "canary"),
    (0.80, 0.85, None, "direct", "direct"),    # a raise goes as picked
    (0.80, 0.85, None, "canary", "canary"),
    (0.80, 0.80, None, "direct", "direct"),
    (0.90, 0.85, 4, "direct", "refused"),      # a lower cluster threshold: no canary of one cluster
    (0.90, 0.95, 4, "direct", "direct"),
])
def test_panel_threshold_routes(current, new, cluster, mode, route):
    assert panel_threshold_rollout(current, new, cluster, mode).route == route


def test_panel_routes_say_why():
    forced = panel_threshold_rollout(0.80, 0.75, None, "direct")
    assert "0.800 -> 0.750 lowers the threshold" in forced.reason and "sequential test" in forced.reason
    assert panel_threshold_rollout(0.80, 0.75, None, "canary").reason == ""  # picked: nothing to explain
    refused = panel_threshold_rollout(0.90, 0.85, 4, "direct").reason
    assert "cluster 4" in refused and "0.900 -> 0.850" in refused and "control panel" not in refused
    multi = panel_multi_rollout(0.50, 0.01, 0.52, 0.005, "direct")
    assert multi.route == "canary" and "answer margin 0.010 -> 0.005" in multi.reason
    assert "score floor" not in multi.reason
    assert panel_multi_rollout(0.50, 0.01, 0.52, 0.02, "direct").route == "direct"  # both raised
    assert panel_multi_rollout(0.50, 0.01, 0.45, 0.01, "canary").route == "canary"
