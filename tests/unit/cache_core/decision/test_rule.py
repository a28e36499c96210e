"""HitRule.decide on hand-made candidates: thresholds, guards and the judge stage."""
from __future__ import annotations

import numpy as np

from cache_core.decision.judge import JUDGE_VETO, NO_JUDGE, judge_for
from cache_core.decision.rule import HitRule
from cache_core.decision.thresholds import threshold_for
from cache_core.experiments import ArmConfig, CanaryConfig
from cache_core.types import CacheEntry, Candidate


def candidate(query: str, similarity: float, answer: str = "a") -> Candidate:
    entry = CacheEntry(entry_id=query, query=query, embedding=np.zeros(2, dtype=np.float32), answer=answer,
                       created_at=0.0, ttl_s=60.0, ttl_policy="absolute", max_age_s=60.0,
                       namespace="default", intent_cluster=0)
    return Candidate(entry, similarity)


class Refuses:
    """A judge that refuses one cached question."""

    accept_at = 0.5

    def __init__(self, refused: str):
        self.refused, self.calls = refused, []

    def score(self, query, cached_query, cosine, *, cached_answer):
        self.calls.append(cached_query)
        return 0.1 if cached_query == self.refused else 0.9


def test_thresholds_follow_variant_then_cluster_then_arm():
    arm = ArmConfig(name="a", threshold=0.8, cluster_thresholds={3: 0.7}, canary=CanaryConfig(threshold=0.9, share=0.5))
    assert (threshold_for(arm, 3), threshold_for(arm, 4), threshold_for(arm, 3, "canary")) == (0.7, 0.8, 0.9)


def test_the_first_eligible_candidate_is_served_and_the_threshold_reported():
    arm = ArmConfig(name="a", threshold=0.8)
    decision = HitRule().decide("q", [candidate("x", 0.9), candidate("y", 0.85)], arm, cluster=0)
    assert decision.hit and decision.served.entry.query == "x" and decision.threshold == 0.8
    miss = HitRule().decide("q", [candidate("x", 0.79)], arm, cluster=0)
    assert not miss.hit and miss.guard is None and miss.eligible == []


def test_a_guard_vetoes_and_the_next_candidate_is_tried():
    arm = ArmConfig(name="a", threshold=0.8, guards=["numbers"])
    decision = HitRule().decide("transfer $50", [candidate("transfer $500", 0.95), candidate("transfer 50 dollars", 0.9)],
                                arm, cluster=0)
    assert decision.served.entry.query == "transfer 50 dollars" and decision.guard == "numbers"


def test_the_judge_runs_after_the_guards_and_may_veto():
    judge = Refuses("x")
    rule = HitRule(judges=lambda arm: judge)
    arm = ArmConfig(name="a", threshold=0.8)
    decision = rule.decide("q", [candidate("x", 0.95), candidate("y", 0.9)], arm, cluster=0)
    assert decision.served.entry.query == "y" and decision.guard == JUDGE_VETO and judge.calls == ["x", "y"]
    assert not rule.decide("q", [candidate("x", 0.95)], arm, cluster=0).hit


def test_arms_have_no_judge_by_default():
    assert judge_for(ArmConfig(name="a")) is NO_JUDGE
