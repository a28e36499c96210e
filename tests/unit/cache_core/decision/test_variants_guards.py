"""Canary variants and lexical guards inside SemanticCache (hand-made similarities)."""
from __future__ import annotations

import pytest

from cache_core.decision.thresholds import multi_for
from cache_core.experiments import ArmConfig, CanaryConfig, assign
from tests.unit.cache_core.test_cache import E0, make_cache
from tests.unit.cache_core.helpers import at_cosine


def units_by_variant(exp, n=400):
    out = {"base": [], "canary": []}
    for i in range(n):
        out[assign(exp, f"u{i}").variant].append(f"u{i}")
    return out


def test_canary_units_use_canary_threshold_and_share_the_arms_partition():
    arm = ArmConfig(name="a", threshold=0.9, canary=CanaryConfig(threshold=0.7, share=0.3))
    cache, _, sink, exp = make_cache({"q": E0, "p": at_cosine(0.8)}, arm)
    units = units_by_variant(exp)
    assert units["canary"] and units["base"]
    cache.store("q", "ans", unit_id=units["base"][0])       # stored by a base unit
    canary = cache.lookup("p", unit_id=units["canary"][0])
    base = cache.lookup("p", unit_id=units["base"][1])
    assert canary.hit and canary.variant == "canary" and canary.threshold == 0.7
    assert not base.hit and base.variant == "base" and base.threshold == 0.9
    assert canary.answer == "ans" and canary.arm == base.arm == "a"
    assert [e.variant for e in sink.events] == ["canary", "base"]
    assert len(cache.partitions()) == 1                      # one store for the arm


def test_a_multi_canary_tries_its_own_score_floor_on_the_same_ranking():
    floor_canary = CanaryConfig(threshold=0.7, share=0.3, score_floor=0.3)
    arm = ArmConfig(name="a", threshold=0.7, similarity="multi", multi={"threshold": 0.95}, canary=floor_canary)
    cache, _, sink, exp = make_cache({"q": E0, "p": at_cosine(0.8)}, arm)
    units = units_by_variant(exp)
    cache.store("q", "ans", unit_id=units["base"][0])
    canary = cache.lookup("p", unit_id=units["canary"][0])
    base = cache.lookup("p", unit_id=units["base"][1])
    assert canary.hit and canary.answer == "ans" and not base.hit   # same cosine gate, floors differ
    scores = [(e.variant, e.score) for e in sink.events]
    assert [v for v, _ in scores] == ["canary", "base"] and 0.3 <= scores[0][1] == scores[1][1] < 0.95
    assert multi_for(arm, "canary").threshold == 0.3 and multi_for(arm, "base").threshold == 0.95
    assert multi_for(arm, "canary").answer_margin == arm.multi.answer_margin  # not set: the arm's


def test_a_canary_floor_on_a_cosine_arm_is_refused():
    with pytest.raises(ValueError, match="needs similarity 'multi'"):
        ArmConfig(name="a", canary=CanaryConfig(threshold=0.7, share=0.3, answer_margin=0.02))


def test_without_canary_everyone_is_base():
    cache, _, sink, _ = make_cache({"q": E0})
    cache.lookup("q", unit_id="u1")
    assert sink.events[-1].variant == "base"


NEG = {"How do I enable two-factor auth?": E0, "How do I disable two-factor auth?": at_cosine(0.93)}


def test_guard_turns_a_would_be_hit_into_a_counted_miss():
    arm = ArmConfig(name="a", threshold=0.8, guards=["negation", "numbers"])
    cache, _, sink, _ = make_cache(dict(NEG), arm)
    cache.store("How do I enable two-factor auth?", "Settings > Security > Enable", unit_id="u")
    result = cache.lookup("How do I disable two-factor auth?", unit_id="u")
    assert not result.hit and result.decision == "miss" and result.guard == "negation"
    event = sink.events[-1]
    assert event.guard == "negation" and event.decision == "miss" and not event.hit
    assert event.similarity > event.threshold and event.entry_id is not None


def test_guard_off_means_the_false_hit_is_served():
    cache, _, sink, _ = make_cache(dict(NEG), ArmConfig(name="a", threshold=0.8))
    cache.store("How do I enable two-factor auth?", "enable answer", unit_id="u")
    result = cache.lookup("How do I disable two-factor auth?", unit_id="u")
    assert result.hit and result.guard is None and sink.events[-1].guard is None


def test_next_candidate_above_threshold_is_served_when_the_best_is_blocked():
    table = {"transfer $500 now": E0, "transfer $50 now": at_cosine(0.95),
             "send $50 now": at_cosine(0.9)}
    cache, _, _, _ = make_cache(table, ArmConfig(name="a", threshold=0.8, guards=["numbers"]))
    cache.store("transfer $500 now", "five hundred", unit_id="u")
    cache.store("send $50 now", "fifty", unit_id="u")
    result = cache.lookup("transfer $50 now", unit_id="u")
    assert result.hit and result.answer == "fifty" and result.guard is None
