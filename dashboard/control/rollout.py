"""How auto-tune sends a recommended change out: a loosening only through a tested canary.

A lower cosine threshold, score floor or answer margin serves hits the current setting
refuses, and the labels behind the recommendation are a sample of yesterday's traffic
(under yesterday's contents and, item 4 of issue 26, maybe not a random sample). So
every loosening is tried on a canary first, whose labelled hits the exact always-valid
test of ``canary`` promotes or rolls back: a fresh sequential test of the value itself.
Where that cannot be done the change is refused with the reason, never pushed directly:

- a per-cluster threshold: a canary tries one threshold on the whole arm (every cluster),
  so there is no canary of one cluster's threshold;
- ``--canary-share 0``: no canary at all.

A tightening (a higher threshold, floor or margin) serves a subset of what runs now, so
it cannot raise the false-hit count: it goes out directly when there is no canary share
(cluster thresholds, multi floor / margin), as before.

The control panel's pushes follow the same rule (``panel_threshold_rollout``,
``panel_multi_rollout``): a lower arm threshold, score floor or answer margin typed there
goes out as a canary even when "direct" was picked, and a lower cluster threshold is
refused, each with the reason the page shows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dashboard.control.tuning import Recommendation
from dashboard.control.tuning_multi import MultiRecommendation

Route = Literal["canary", "direct", "refused", "none"]
PanelMode = Literal["direct", "canary"]
EPS = 1e-9


@dataclass(frozen=True)
class Rollout:
    route: Route
    """canary: start a canary with the value; direct: push it; refused: hold (``reason``
    says why); none: nothing to send."""
    reason: str = ""


def threshold_rollout(rec: Recommendation, canary_share: float) -> Rollout:
    """The route of a ``tuning.recommend`` / ``exploration`` result (see the module docstring)."""
    if rec.action not in ("change", "explore") or rec.recommended is None:
        return Rollout("none")
    loosening = rec.recommended < rec.current - EPS
    if rec.cluster is not None:
        if not loosening:
            return Rollout("direct")
        return Rollout("refused", _cluster_refusal(rec.cluster, rec.current, rec.recommended))
    if canary_share > 0:
        return Rollout("canary")
    if loosening:
        return Rollout("refused", f"not lowering the threshold {rec.current:.3f} -> {rec.recommended:.3f}: "
                                  "a lower threshold goes out only through a canary, and --canary-share is 0")
    return Rollout("direct")


def _cluster_refusal(cluster: int, current: float, new: float) -> str:
    return (f"not lowering cluster {cluster}'s threshold {current:.3f} -> {new:.3f}: a lower threshold goes out "
            "only through a canary, and a canary tries one threshold on the whole arm (lower the arm's threshold "
            "on a canary instead)")


_CANARY_TEST = ("its labelled hits are judged by the exact sequential test of the false-hit rate against the "
                "target, which promotes or rolls it back")


def panel_threshold_rollout(current: float, new: float, cluster: int | None, mode: PanelMode) -> Rollout:
    """The route of a threshold typed on the control panel (``mode``: what the operator picked).
    A raise goes as picked (a cluster's directly: no canary of one cluster); a lower arm threshold
    always as a canary, a lower cluster threshold is refused (the module docstring)."""
    loosening = new < current - EPS
    if cluster is not None:
        return Rollout("refused", _cluster_refusal(cluster, current, new)) if loosening else Rollout("direct")
    if loosening and mode == "direct":
        return Rollout("canary", f"{current:.3f} -> {new:.3f} lowers the threshold, so it goes out as a canary "
                                 f"(as every loosening auto-tune makes): {_CANARY_TEST}")
    return Rollout(mode)


def panel_multi_rollout(current_floor: float, current_margin: float, floor: float, margin: float,
                        mode: PanelMode) -> Rollout:
    """The route of a multi arm's score floor / answer margin typed on the control panel: as
    picked, except that a lower floor or margin always goes out as a canary."""
    lowered = [f"{name} {old:.3f} -> {value:.3f}" for name, old, value in (
        ("score floor", current_floor, floor), ("answer margin", current_margin, margin)) if value < old - EPS]
    if lowered and mode == "direct":
        return Rollout("canary", f"{' and '.join(lowered)} serves what the arm refuses now, so it goes out as a "
                                 f"canary (as every loosening auto-tune makes): {_CANARY_TEST}")
    return Rollout(mode)


def multi_loosens(rec: MultiRecommendation) -> bool:
    """A lower score floor or answer margin than the arm's (serves what it refuses now)."""
    return ((rec.recommended_floor is not None and rec.recommended_floor < rec.current_floor - EPS)
            or (rec.recommended_margin is not None and rec.recommended_margin < rec.current_margin - EPS))


def multi_rollout(rec: MultiRecommendation, canary_share: float) -> Rollout:
    """The route of a ``tuning_multi.recommend_multi`` / ``multi_exploration`` result: a
    loosening on a canary of ``canary_share`` (refused at 0), a tightening directly."""
    if rec.action not in ("change", "explore") or rec.recommended_floor is None:
        return Rollout("none")
    if rec.action == "explore" or multi_loosens(rec):
        if canary_share > 0:
            return Rollout("canary")
        moved = "; ".join(f"{name} {old:.3f} -> {new:.3f}" for name, old, new in (
            ("score floor", rec.current_floor, rec.recommended_floor),
            ("answer margin", rec.current_margin, rec.recommended_margin)) if new < old - EPS)
        return Rollout("refused", f"not lowering the {moved}: a lower floor or margin goes out only through "
                                  "a canary, and the canary share is 0")
    return Rollout("direct")
