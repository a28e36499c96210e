"""Canary verdicts and canary history, free of any UI or I/O.

``evaluate_canary`` says promote / rollback / continue for a running canary from its
labelled hits, with an exact always-valid test against its target (safe to re-evaluate on
every run). ``rolled_back_canaries`` reads the audit (queries.change_history with
``configs_by_version``) for canaries that ended without their values becoming the arm's;
``last_failed_try`` bounds an arm's next exploration by the highest value one tried.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

import pandas as pd

from cache_core.experiments import CanaryConfig, ExperimentConfig
from dashboard.control.guardrails import Guardrails
from dashboard.control.stats import DEFAULT_ALPHA, ProportionStat
from dashboard.control.target_test import test_against_target


CanaryAction = Literal["promote", "rollback", "continue"]


@dataclass(frozen=True)
class CanaryDecision:
    action: CanaryAction
    reason: str
    labelled: int
    wrong: int
    false_hit_rate: float | None
    evidence: float | None
    """The always-valid p-value of the side the labels lean to (``target_test.TargetTest``)."""


def evaluate_canary(canary: CanaryConfig, labelled: ProportionStat, *, min_labelled: int = 30,
                    alpha: float = DEFAULT_ALPHA, shadow: ProportionStat | None = None) -> CanaryDecision:
    """Promote, roll back, or keep watching a canary, from its labelled hits (n, wrong).

    rollback: the false-hit rate is above ``canary.target_false_hit_rate`` with confidence;
    promote: it is below with confidence and at least ``min_labelled`` labels are in;
    continue: otherwise. Confidence is the exact, always-valid one-sided test of
    ``target_test`` (truncated Beta mixtures), so the auto-tune loop may re-evaluate on
    every run: a canary exactly at target is rolled back, or promoted, with chance at most
    ``alpha`` each over all its looks. (A fixed Clopper-Pearson bound re-checked on every
    run, the former ``bound`` method, rolled back a third of such canaries and promoted as
    many: gone.)

    ``shadow``: the canary's hits as shadow checks judged them (``queries.canary_shadow_stats``),
    never pooled with the users'. With it each source is tested at half the alpha: either one above
    the target with confidence rolls back; one below with confidence and ``min_labelled`` verdicts
    promotes, unless the other is above.
    """
    if shadow is not None and shadow.n > 0:
        return _two_sources(canary, labelled, shadow, min_labelled, alpha)
    target = canary.target_false_hit_rate
    n, wrong, rate = labelled.n, labelled.successes, labelled.rate
    result = test_against_target(labelled, target, alpha)
    above, below, evidence = result.side == "above", result.side == "below", result.p_value
    shown = "—" if rate is None else f"{rate:.1%}"
    if above:
        return CanaryDecision("rollback", f"false-hit rate {shown} ({wrong}/{n}) is above the target "
                              f"{target:.1%} with confidence", n, wrong, rate, evidence)
    if below and n >= min_labelled:
        return CanaryDecision("promote", f"false-hit rate {shown} ({wrong}/{n}) is below the target "
                              f"{target:.1%} with confidence", n, wrong, rate, evidence)
    need = f"; {n}/{min_labelled} labels" if n < min_labelled else ""
    return CanaryDecision("continue", f"not yet conclusive: {shown} ({wrong}/{n}) vs target {target:.1%}{need}",
                          n, wrong, rate, evidence)


def _two_sources(canary: CanaryConfig, users: ProportionStat, shadow: ProportionStat, min_labelled: int,
                 alpha: float) -> CanaryDecision:
    """``evaluate_canary`` on users' and shadow verdicts apart, each at alpha / 2."""
    target = canary.target_false_hit_rate
    tests = {name: (stat, test_against_target(stat, target, alpha / 2)) for name, stat in
             (("users", users), ("shadow", shadow))}

    def said(name: str) -> str:
        stat = tests[name][0]
        shown = "—" if stat.rate is None else f"{stat.rate:.1%}"
        return f"{name} {shown} ({stat.successes}/{stat.n})"

    above = [name for name, (_, t) in tests.items() if t.side == "above"]
    below = [name for name, (stat, t) in tests.items() if t.side == "below" and stat.n >= min_labelled]
    both = f"{said('users')}, {said('shadow')}"
    decided = above or below
    name = decided[0] if decided else "users"
    stat, result = tests[name]
    if above:
        return CanaryDecision("rollback", f"false-hit rate above the target {target:.1%} with confidence by "
                              f"{' and '.join(above)}' verdicts: {both}", stat.n, stat.successes, stat.rate,
                              result.p_value)
    if below:
        return CanaryDecision("promote", f"false-hit rate below the target {target:.1%} with confidence by "
                              f"{' and '.join(below)}' verdicts: {both}", stat.n, stat.successes, stat.rate,
                              result.p_value)
    return CanaryDecision("continue", f"not yet conclusive vs target {target:.1%}: {both}; {min_labelled} "
                          "verdicts of one source needed", users.n, users.successes, users.rate,
                          tests["users"][1].p_value)


def configs_by_version(history: pd.DataFrame, *configs: ExperimentConfig | None) -> dict[int, ExperimentConfig]:
    """Every config whose version is known: the ``config_json`` of queries.change_history
    rows plus ``configs`` (the experiments file's, the live one); later arguments win."""
    known: dict[int, ExperimentConfig] = {}
    if not history.empty:
        for config_json in history["config_json"]:
            if config_json:
                config = ExperimentConfig.model_validate_json(config_json)
                known[config.version] = config
    for config in configs:
        if config is not None:
            known[config.version] = config
    return known


@dataclass(frozen=True)
class RolledBack:
    """A canary the audit shows ending without its values becoming the arm's."""

    arm: str
    at_ms: int
    """When it ended (the audit row's time)."""
    threshold: float | None
    """The cosine threshold it tried; None when it kept the arm's."""
    score_floor: float | None
    """A multi canary's score floor; None when it kept the arm's."""

    def describe(self, what: Literal["threshold", "score_floor"]) -> str:
        when = datetime.fromtimestamp(self.at_ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        return f"a canary at {what.replace('_', ' ')} {getattr(self, what):.3f} was rolled back at {when}"


def rolled_back_canaries(history: pd.DataFrame, configs: dict[int, ExperimentConfig]) -> list[RolledBack]:
    """Every canary in queries.change_history that ended with the arm's threshold and multi
    settings unchanged (auto-tune's or an operator's rollback, or a restore), newest first;
    ``configs`` from ``configs_by_version``. A promotion changes the arm, so it is not one."""
    if history.empty:
        return []
    found: list[RolledBack] = []
    rows = history.drop_duplicates("new_version").sort_values("new_version", ascending=False)
    for row in rows.itertuples(index=False):
        before, after = configs.get(int(row.old_version)), configs.get(int(row.new_version))
        if before is None or after is None:
            continue
        kept = {arm.name: arm for arm in after.arms}
        for arm in before.arms:
            now = kept.get(arm.name)
            if arm.canary is None or now is None or now.canary is not None:
                continue
            if now.threshold != arm.threshold or now.multi != arm.multi:
                continue
            tried = arm.canary
            found.append(RolledBack(arm.name, int(pd.Timestamp(row.ts).timestamp() * 1000),
                                    tried.threshold if abs(tried.threshold - arm.threshold) > 1e-9 else None,
                                    tried.score_floor))
    return found


def last_failed_try(rolled_back: list[RolledBack], arm: str, what: Literal["threshold", "score_floor"],
                    now_ms: int, g: Guardrails) -> RolledBack | None:
    """The rolled-back canary of ``arm`` within ``g.explore_memory_s`` that tried the highest
    ``what`` (the one that bounds an exploration), if any."""
    since = now_ms - g.explore_memory_s * 1000
    tries = [r for r in rolled_back if r.arm == arm and r.at_ms >= since and getattr(r, what) is not None]
    return max(tries, key=lambda r: getattr(r, what), default=None)
