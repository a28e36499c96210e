"""A loosening canary is promoted only when its *measured* hit rate confirms the gain.

The hit rates auto-tune optimises (``whatif``, ``tuning.recommend``) replay logged decisions
with the cache's contents held fixed. A cache stores an entry on each miss, so a lower
threshold also stores fewer entries, and the hit rate it really gets can fall short of the
replay (issue 26, item 5: +3 to +4 points optimistic two steps down in a toy model). A canary
measures it: its units (a hash share of the arm's users) run the new value beside the rest
of the arm, on the same cache. So a canary that loosens (a lower threshold, score floor or
answer margin) is promoted only when both hold:

- its false-hit rate is under the target with confidence (``canary.evaluate_canary``), and
- its hit rate is above the rest of the arm's with confidence: the always-valid confidence
  sequence of the difference of per-user hit rates (``ratio.sequential_test_ratios``, users as
  the unit: the canary hash splits users) lies above 0.

When the sequence lies below 0 (the canary serves *fewer* hits with confidence), it is rolled
back; in between it keeps running. A tightening canary (a higher value) is judged on its
false-hit rate alone: it trades hits for safety by design.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import pandas as pd

from cache_core.decision.thresholds import multi_for
from cache_core.experiments import ArmConfig
from dashboard.control.canary import CanaryDecision
from dashboard.control.ratio import RatioStat, sequential_test_ratios
from dashboard.control.stats import DEFAULT_ALPHA

EPS = 1e-9
GainStatus = Literal["confirmed", "refuted", "unsure", "no_data"]


def loosens(arm: ArmConfig) -> bool:
    """The arm's running canary serves what the arm refuses: a lower cosine threshold, or (multi
    arms) a lower score floor or answer margin."""
    canary = arm.canary
    if canary is None:
        return False
    if canary.threshold < arm.threshold - EPS:
        return True
    if not canary.multi_override:
        return False
    trial, base = multi_for(arm, "canary"), arm.multi
    return trial.threshold < base.threshold - EPS or trial.answer_margin < base.answer_margin - EPS


def variant_stat(units: pd.DataFrame | None, variant: str) -> RatioStat | None:
    """The ``RatioStat`` of one variant in queries.canary_unit_stats (None when absent)."""
    if units is None or units.empty:
        return None
    row = units[units["variant"] == variant]
    if row.empty:
        return None
    return RatioStat.from_sums(row.iloc[0])


@dataclass(frozen=True)
class GainCheck:
    status: GainStatus
    diff: float | None = None
    """Canary hit rate minus the rest of the arm's (per user, pooled)."""
    low: float | None = None
    high: float | None = None
    """The always-valid (1 - alpha) confidence sequence of ``diff`` at this look."""

    def describe(self) -> str:
        if self.status == "no_data":
            return "no measured hit rate yet"
        return (f"measured hit rate {self.diff:+.1%} vs the rest of the arm "
                f"(always-valid interval {self.low:+.1%} to {self.high:+.1%})")


def measured_gain(base: RatioStat | None, canary: RatioStat | None, alpha: float = DEFAULT_ALPHA) -> GainCheck:
    """Whether the canary's per-user hit rate is above the base units' with confidence."""
    if base is None or canary is None:
        return GainCheck("no_data")
    result = sequential_test_ratios(base, canary, alpha)
    if result.status != "ok":
        return GainCheck("no_data")
    status: GainStatus = "confirmed" if result.ci_low > 0 else "refuted" if result.ci_high < 0 else "unsure"
    return GainCheck(status, result.diff, result.ci_low, result.ci_high)


def gate_promotion(decision: CanaryDecision, arm: ArmConfig, units: pd.DataFrame | None,
                   alpha: float = DEFAULT_ALPHA) -> CanaryDecision:
    """``decision`` (``evaluate_canary``) with a loosening canary's promotion held until the
    measured hit rate confirms the gain, or turned into a rollback when it refutes it (see
    the module docstring). Other verdicts and tightening canaries pass unchanged."""
    if decision.action != "promote" or not loosens(arm):
        return decision
    check = measured_gain(variant_stat(units, "base"), variant_stat(units, "canary"), alpha)
    if check.status == "confirmed":
        return replace(decision, reason=f"{decision.reason}; {check.describe()} confirms the gain")
    if check.status == "refuted":
        return replace(decision, action="rollback",
                       reason=f"{decision.reason}, but the {check.describe()} is lower with confidence: "
                              "the replayed gain did not happen")
    return replace(decision, action="continue",
                   reason=f"{decision.reason}; waiting for the measured hit rate to confirm the gain the "
                          f"replay promised ({check.describe()})")
