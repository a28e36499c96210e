"""HitRule.decide on hand-made candidates: thresholds, guards and the judge stage."""
from __future__ import annotations

import numpy as np

from cache_core.decision.judge import JUDGE_UNAVAILABLE, JUDGE_VETO, Unavailable, no_judges
from cache_core.decision.rule import HitRule
from cache_core.decision.thresholds import threshold_for
from cache_core.experiments import ArmConfig, CanaryConfig, JudgeConfig
from cache_core.records import CacheEntry, Candidate


def candidate(query: str, similarity: float, answer: str = "a") -> Candidate:
    entry = CacheEntry(entry_id=query, query=query, embedding=np.zeros(2, dtype=np.float32), answer=answer,
                       created_at=0.0, ttl_s=60.0, ttl_policy="absolute", max_age_s=60.0,
                       namespace="default", intent_cluster=0)
    return Candidate(entry, similarity)


class Refuses:
    """A judge that gives one cached question a low probability and the others a high one."""

    version = "t1"
    accept_at = 0.5

    def __init__(self, refused: str, others: float = 0.9):
        self.refused, self.others, self.calls = refused, others, []

    def score_many(self, query, cached_queries, cosines):
        self.calls.append(list(cached_queries))
        return np.array([0.1 if q == self.refused else self.others for q in cached_queries])


JUDGED = ArmConfig(name="a", threshold=0.8, judge=JudgeConfig(version="t1"))


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


def test_the_judge_serves_its_most_probable_candidate_in_one_call():
    judge = Refuses("x")
    rule = HitRule(judges=lambda arm, variant="base": judge)
    decision = rule.decide("q", [candidate("x", 0.95), candidate("y", 0.9)], JUDGED, cluster=0)
    assert decision.served.entry.query == "y" and judge.calls == [["x", "y"]]
    assert (decision.judge_version, decision.judge_probability) == ("t1", 0.9) and decision.judge_ms >= 0


def test_below_the_operating_point_the_judge_makes_a_miss():
    rule = HitRule(judges=lambda arm, variant="base": Refuses("x", others=0.3))
    decision = rule.decide("q", [candidate("x", 0.95), candidate("y", 0.9)], JUDGED, cluster=0)
    assert not decision.hit and decision.guard == JUDGE_VETO and decision.judge_probability == 0.3


def test_the_judge_reads_only_what_the_guards_let_through_and_at_most_its_candidates():
    judge = Refuses("none")
    arm = JUDGED.model_copy(update={"guards": ["numbers"], "judge": JudgeConfig(version="t1", candidates=1)})
    rule = HitRule(judges=lambda arm, variant="base": judge)
    rule.decide("pay 5 dollars", [candidate("pay 6 dollars", 0.95), candidate("pay 5 usd", 0.9),
                                  candidate("pay five dollars", 0.85)], arm, cluster=0)
    assert judge.calls == [["pay 5 usd"]]


def test_an_unavailable_judge_misses_or_falls_back_to_the_threshold_as_configured():
    for policy, served in (("miss", None), ("threshold", "x")):
        arm = JUDGED.model_copy(update={"judge": JudgeConfig(version="t1", on_unavailable=policy)})
        decision = HitRule(judges=no_judges).decide("q", [candidate("x", 0.95)], arm, cluster=0)
        assert (decision.served.entry.query if decision.hit else None) == served
        assert decision.judge_version == "t1"
        assert decision.guard == (JUDGE_UNAVAILABLE if policy == "miss" else None)


def test_a_canary_tries_its_own_judge_version():
    seen = []

    def judges(arm, variant="base"):
        from cache_core.decision.judge import judge_config
        seen.append(judge_config(arm, variant).version)
        return Refuses("none")

    arm = JUDGED.model_copy(update={"canary": CanaryConfig(threshold=0.8, share=0.1, judge=JudgeConfig(version="t2"))})
    HitRule(judges=judges).decide("q", [candidate("x", 0.9)], arm, cluster=0, variant="canary")
    HitRule(judges=judges).decide("q", [candidate("x", 0.9)], arm, cluster=0)
    assert seen == ["t2", "t1"]


def test_arms_have_no_judge_by_default():
    assert ArmConfig(name="a").judge is None
    assert no_judges(ArmConfig(name="a")) is None
    assert isinstance(no_judges(JUDGED), Unavailable)
