"""Decision logic of SemanticCache with exact, hand-made similarities and a manual clock."""
from __future__ import annotations

import numpy as np
import pytest

from cache_core.admission import EVICTION_GRACE_S
from cache_core.cache import SemanticCache
from cache_core.records import InvalidRequest, entry_bytes
from cache_core.events import CacheEvent, ControlMessage
from cache_core.experiments import ArmConfig
from cache_core.registry import ExperimentRegistry, UnknownExperiment
from tests.unit.cache_core.helpers import (ManualClock, RecordingSink, TableEmbedder, at_cosine,
                                      experiment, unit_in_arm, unit_vec)

E0 = unit_vec(1.0)


def make_cache(table, *arms, mode="partitioned", traffic_share=1.0, **kwargs):
    arms = arms or (ArmConfig(name="a", threshold=0.8, ann_check_rate=1.0),)
    exp = experiment(*arms, mode=mode, traffic_share=traffic_share)
    clock, sink = ManualClock(), RecordingSink()
    cache = SemanticCache(TableEmbedder(table), ExperimentRegistry({exp.experiment_id: exp}),
                          clock=clock, event_sink=sink, seed=1, **kwargs)
    return cache, clock, sink, exp


def test_hit_at_exactly_the_threshold_and_miss_just_below():
    near = at_cosine(0.8)
    cache, _, _, _ = make_cache({"stored": E0, "asked": near})
    sim = float(np.float32(E0 @ (near / np.linalg.norm(near))))
    cache.store("stored", "answer", unit_id="u")
    exact = make_cache({"stored": E0, "asked": near}, ArmConfig(name="a", threshold=sim))[0]
    exact.store("stored", "answer", unit_id="u")
    assert exact.lookup("asked", unit_id="u").hit
    above = make_cache({"stored": E0, "asked": near},
                       ArmConfig(name="a", threshold=float(np.nextafter(sim, 2.0))))[0]
    above.store("stored", "answer", unit_id="u")
    result = above.lookup("asked", unit_id="u")
    assert not result.hit and result.decision == "miss"
    assert result.similarity == pytest.approx(sim)


def test_every_lookup_emits_one_complete_event():
    cache, _, sink, exp = make_cache({"q": E0, "p": at_cosine(0.9)})
    miss = cache.lookup("q", unit_id="u1")          # empty index: similarity null
    cache.store("q", "ans", unit_id="u1")
    hit = cache.lookup("p", unit_id="u1")
    assert len(sink.events) == 2
    assert miss.event.decision == "miss" and miss.event.similarity is None
    event = hit.event
    assert event.decision == "hit" and event.hit and hit.answer == "ans"
    assert event.similarity == pytest.approx(0.9, abs=1e-5) and event.threshold == 0.8
    assert event.arm == "a" and event.experiment_id == "exp" and event.config_version == exp.version
    assert event.assignment_prob == 1.0 and event.partition_mode == "partitioned"
    assert event.embedding_l2_norm == pytest.approx(1.0) and event.intent_cluster >= 0
    assert event.entry_id == hit.entry_id and event.entry_age_s == 0.0 and event.entry_ttl_s > 0
    assert event.index_kind == "flat" and event.ann_checked and event.ann_agree
    assert event.ann_recall_at_k == 1.0 and event.query_chars == 1 and event.query_text is None
    assert event.latency_ms >= event.embed_ms >= 0 and event.search_ms >= 0
    assert CacheEvent.model_validate_json(event.model_dump_json()) == event


def test_miss_below_threshold_still_logs_similarity():
    cache, _, _, _ = make_cache({"q": E0, "far": at_cosine(0.5)})
    cache.store("q", "ans", unit_id="u")
    result = cache.lookup("far", unit_id="u")
    assert not result.hit and result.similarity == pytest.approx(0.5, abs=1e-5)
    assert result.event.entry_id is not None  # the nearest entry, for lifetime attribution


def test_query_text_only_when_allowed():
    cache, _, _, _ = make_cache({"q": E0}, emit_query_text=True)
    assert cache.lookup("q", unit_id="u").event.query_text == "q"


def test_absolute_ttl_expires_without_renewal():
    arm = ArmConfig(name="a", threshold=0.8, ttl_s=100, ttl_policy="absolute")
    cache, clock, _, _ = make_cache({"q": E0}, arm)
    cache.store("q", "ans", unit_id="u")
    clock.advance(60)
    assert cache.lookup("q", unit_id="u").hit
    clock.advance(39.9)
    result = cache.lookup("q", unit_id="u")
    assert result.hit and result.event.entry_age_s == pytest.approx(99.9)
    clock.advance(0.2)
    assert not cache.lookup("q", unit_id="u").hit
    assert len(cache.partition_for("default", "exp", "a")) == 0  # expired entry removed


def test_sliding_ttl_renews_on_hit_but_caps_at_max_age():
    arm = ArmConfig(name="a", threshold=0.8, ttl_s=100, ttl_policy="sliding", max_age_s=250)
    cache, clock, _, _ = make_cache({"q": E0}, arm)
    cache.store("q", "ans", unit_id="u")
    for _ in range(2):
        clock.advance(90)
        assert cache.lookup("q", unit_id="u").hit  # t=90, t=180: each hit renews
    clock.advance(60)   # t=240: 60 s after the last hit, under max_age
    assert cache.lookup("q", unit_id="u").hit
    clock.advance(20)   # t=260: renewed to 340, but capped at created+250
    assert not cache.lookup("q", unit_id="u").hit


def test_sliding_ttl_expires_without_hits():
    arm = ArmConfig(name="a", threshold=0.8, ttl_s=100, ttl_policy="sliding")
    cache, clock, _, _ = make_cache({"q": E0}, arm)
    cache.store("q", "ans", unit_id="u")
    clock.advance(100.01)
    assert not cache.lookup("q", unit_id="u").hit


def test_store_ttl_override_and_default_ttl_setting():
    cache, clock, _, _ = make_cache({"q": E0, "r": unit_vec(0, 1)}, default_ttl_s=50)
    cache.store("q", "ans", unit_id="u")              # arm ttl not set explicitly -> 50
    cache.store("r", "ans", unit_id="u", ttl_s=500)
    clock.advance(60)
    assert not cache.lookup("q", unit_id="u").hit
    assert cache.lookup("r", unit_id="u").hit


def at_angle(degrees: float) -> np.ndarray:
    rad = np.radians(degrees)
    return unit_vec(float(np.cos(rad)), float(np.sin(rad)))


# Neighbours 40 degrees apart: cosine 0.766, the ordinary-LRU admission tier.
SPREAD = {"q0": at_angle(0), "q1": at_angle(40), "q2": at_angle(-40)}


def test_lru_eviction_by_entry_count():
    arm = ArmConfig(name="a", threshold=0.99, capacity_entries=2)
    cache, _, _, _ = make_cache(dict(SPREAD), arm)
    for name in ("q0", "q1"):
        assert cache.store(name, "ans", unit_id="u").stored
    assert cache.lookup("q0", unit_id="u").hit                     # q0 recently used
    result = cache.store("q2", "ans", unit_id="u")
    assert result.stored and result.reason == "admitted"
    assert cache.lookup("q0", unit_id="u").hit
    assert not cache.lookup("q1", unit_id="u").hit                 # q1 was least recent
    part = cache.partition_for("default", "exp", "a")
    assert len(part) == 2 and part.evictions == 1


def test_capacity_by_bytes():
    size = entry_bytes("q0", "x" * 100, np.ones(8, dtype=np.float32))
    arm = ArmConfig(name="a", threshold=0.99, capacity_bytes=2 * size + 10)
    cache, _, _, _ = make_cache(dict(SPREAD), arm)
    for name in SPREAD:
        assert cache.store(name, "x" * 100, unit_id="u").stored
    part = cache.partition_for("default", "exp", "a")
    assert len(part) == 2 and part.bytes <= part.capacity_bytes
    big = cache.store("q3", "x" * (3 * size), unit_id="u")
    assert not big.stored and big.reason == "too_large"


def test_admission_tiers():
    arm = ArmConfig(name="a", threshold=0.99, capacity_entries=2, ttl_s=100)
    table = {"base": E0, "dup": at_cosine(0.9), "mid": at_angle(-45),
             "novel": unit_vec(0, 0, 1.0), "novel2": unit_vec(0, 0, 0, 1.0)}
    cache, clock, _, _ = make_cache(table, arm)
    assert cache.store("base", "a", unit_id="u").reason == "admitted"      # empty store admits
    dup = cache.store("dup", "a", unit_id="u")
    assert dup.reason == "near_duplicate" and dup.similarity == pytest.approx(0.9, abs=1e-5)
    part = cache.partition_for("default", "exp", "a")
    dup_entry = part.entries[dup.entry_id]
    assert dup_entry.protected and dup_entry.expires_at() - dup_entry.created_at == 100 + EVICTION_GRACE_S
    # Full (2 entries): a novel query is rejected rather than evicting live entries...
    novel = cache.store("novel", "a", unit_id="u")
    assert not novel.stored and novel.reason == "novel_under_pressure" and novel.similarity < 0.6
    # ...a mid-similarity one evicts by LRU, skipping the protected near-duplicate.
    mid = cache.store("mid", "a", unit_id="u")
    assert mid.stored and mid.reason == "admitted"
    assert dup.entry_id in part.entries and len(part) == 2
    # Once entries expire, the eviction a novel query triggers makes room for it.
    clock.advance(131)
    assert cache.store("novel2", "a", unit_id="u").stored


def test_same_query_text_replaces_entry():
    cache, _, _, _ = make_cache({"q": E0})
    first = cache.store("q", "old", unit_id="u")
    second = cache.store("q", "new", unit_id="u", provenance_source="kb", provenance_version="v2")
    assert second.reason == "updated" and second.entry_id != first.entry_id
    result = cache.lookup("q", unit_id="u")
    assert result.answer == "new" and result.provenance == {"source": "kb", "version": "v2"}
    assert len(cache.partition_for("default", "exp", "a")) == 1


def test_conversation_scope_isolation():
    cache, _, _, _ = make_cache({"what about it?": E0})
    cache.store("what about it?", "answer in conversation A", unit_id="u", scope="conv-A")
    assert cache.lookup("what about it?", unit_id="u", scope="conv-A").hit
    assert not cache.lookup("what about it?", unit_id="u", scope="conv-B").hit
    assert not cache.lookup("what about it?", unit_id="u").hit  # unscoped never sees scoped
    cache.store("what about it?", "global answer", unit_id="u")
    assert cache.lookup("what about it?", unit_id="u", scope="conv-A").answer == "answer in conversation A"


def test_namespaces_never_cross():
    cache, _, _, _ = make_cache({"q": E0})
    cache.store("q", "tenant 1", unit_id="u", namespace="t1")
    assert not cache.lookup("q", unit_id="u", namespace="t2").hit


def two_arm_cache(mode):
    arms = (ArmConfig(name="a", threshold=0.8), ArmConfig(name="b", threshold=0.8))
    cache, _, _, exp = make_cache({"q": E0}, *arms, mode=mode)
    return cache, unit_in_arm(exp, "a"), unit_in_arm(exp, "b")


def test_partitioned_mode_isolates_arms():
    cache, unit_a, unit_b = two_arm_cache("partitioned")
    cache.store("q", "from a", unit_id=unit_a)
    assert cache.lookup("q", unit_id=unit_a).hit
    result = cache.lookup("q", unit_id=unit_b)
    assert result.arm == "b" and not result.hit and result.event.partition_mode == "partitioned"


def test_shared_mode_shares_entries_across_arms():
    cache, unit_a, unit_b = two_arm_cache("shared")
    cache.store("q", "from a", unit_id=unit_a)
    result = cache.lookup("q", unit_id=unit_b)
    assert result.arm == "b" and result.hit and result.answer == "from a"
    assert result.event.partition_mode == "shared"


def test_holdout_bypasses_cache():
    cache, _, sink, exp = make_cache({"q": E0}, ArmConfig(name="a", threshold=0.1),
                                     traffic_share=0.5)
    holdout = unit_in_arm(exp, "holdout")
    stored = cache.store("q", "ans", unit_id=holdout)
    assert not stored.stored and stored.reason == "holdout"
    cache.store("q", "ans", unit_id=unit_in_arm(exp, "a"))
    result = cache.lookup("q", unit_id=holdout)
    assert result.decision == "bypass" and not result.hit and result.answer is None
    assert sink.events[-1].decision == "bypass" and sink.events[-1].assignment_prob == 0.5
    assert sink.events[-1].embedding_l2_norm is not None


def test_cluster_threshold_overrides_arm_threshold():
    cache, _, _, exp = make_cache({"q": E0, "p": at_cosine(0.7)})
    cache.store("q", "ans", unit_id="u")
    assert not cache.lookup("p", unit_id="u").hit
    cluster = cache.lookup("p", unit_id="u").intent_cluster
    arm = ArmConfig(name="a", threshold=0.8, cluster_thresholds={cluster: 0.6})
    new = exp.model_copy(update={"arms": [arm], "version": 2})
    assert cache.registry.apply(ControlMessage(experiment=new))
    result = cache.lookup("p", unit_id="u")
    assert result.hit and result.threshold == 0.6 and result.config_version == 2


def test_index_kind_change_rebuilds_partition():
    cache, _, _, exp = make_cache({"q": E0})
    cache.store("q", "ans", unit_id="u")
    new = exp.model_copy(update={"arms": [ArmConfig(name="a", threshold=0.8, index_kind="hnsw")],
                                 "version": 2})
    cache.registry.apply(ControlMessage(experiment=new))
    result = cache.lookup("q", unit_id="u")
    assert result.hit and result.event.index_kind == "hnsw"


@pytest.mark.parametrize("kwargs, message", [
    ({"query": ""}, "non-empty"),
    ({"query": "   "}, "non-empty"),
    ({"query": "x" * 41}, "limit is 40"),
    ({"unit_id": ""}, "unit_id"),
    ({"scope": ""}, "scope"),
])
def test_invalid_lookup_input(kwargs, message):
    cache, _, sink, _ = make_cache({"q": E0}, max_query_chars=40)
    args = {"query": "q", "unit_id": "u", **kwargs}
    with pytest.raises(InvalidRequest, match=message):
        cache.lookup(**args)
    assert sink.events == []


def test_unknown_experiment():
    cache, _, _, _ = make_cache({"q": E0})
    with pytest.raises(UnknownExperiment, match="nope"):
        cache.lookup("q", unit_id="u", experiment_id="nope")


def test_a_random_sample_of_hits_is_asked_for_a_verdict_with_its_probability_logged():
    """ArmConfig.feedback_sample_rate (docs/solicited_feedback.md): each hit is asked with that
    probability, and every hit's event logs it (requested or not); misses are never asked."""
    arm = ArmConfig(name="a", threshold=0.8, ann_check_rate=0.0, feedback_sample_rate=0.25)
    cache, _, sink, _ = make_cache({"q": E0, "p": at_cosine(0.9), "far": unit_vec(0.0, 1.0)}, arm)
    assert not cache.lookup("far", unit_id="u").feedback_requested  # empty index: a miss
    cache.store("q", "ans", unit_id="u")
    hits = [cache.lookup("p", unit_id="u") for _ in range(2000)]
    miss = cache.lookup("far", unit_id="u")
    asked = [h.feedback_requested for h in hits]
    assert all(h.hit for h in hits) and 0.22 < np.mean(asked) < 0.28
    assert [h.event.feedback_requested for h in hits] == asked
    assert {h.event.feedback_prob for h in hits} == {0.25}
    assert not miss.hit and miss.event.feedback_prob is None and not miss.event.feedback_requested
    # an arm that never asks logs no probability, and draws nothing (the ANN sampling stream is unchanged)
    plain, _, _, _ = make_cache({"q": E0, "p": at_cosine(0.9)}, ArmConfig(name="a", threshold=0.8))
    plain.store("q", "ans", unit_id="u")
    event = plain.lookup("p", unit_id="u").event
    assert event.hit and event.feedback_prob is None and not event.feedback_requested
