"""The multi arm's mixed score and answer margin in events (CacheEvent.score / score_margin),
and that they are enough to replay another multi threshold / margin offline."""
from __future__ import annotations

import numpy as np
import pytest

from cache_core.experiments import ArmConfig, MultiSimilarityConfig
from tests.unit.cache_core.helpers import at_cosine, unit_in_arm, unit_vec
from tests.unit.cache_core.test_cache import E0, make_cache

# Phrase weight only: the mixed score equals the cosine, so expected values are exact.
COSINE_ONLY = dict(token=0.0, phrase=1.0, intent=0.0)


def multi_arm(threshold: float = 0.0, answer_margin: float = 0.05, cosine: float = 0.6,
              **weights) -> ArmConfig:
    return ArmConfig(name="a", threshold=cosine, similarity="multi", ann_check_rate=0.0,
                     multi=MultiSimilarityConfig(**(weights or COSINE_ONLY), threshold=threshold,
                                                 answer_margin=answer_margin))


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_ambiguous_miss_logs_score_and_margin_over_the_rival():
    left, right, asked = E0, unit_vec(0.999, 0.0447), at_cosine(0.95)
    cache, _, sink, _ = make_cache({"left": left, "right": right, "asked": asked}, multi_arm())
    cache.store("left", "answer L", unit_id="u")
    cache.store("right", "answer R", unit_id="u")
    result = cache.lookup("asked", unit_id="u")
    event = sink.events[-1]
    best, rival = sorted([cos(asked, left), cos(asked, right)], reverse=True)
    assert not result.hit and event.similarity_mode == "multi"
    assert event.score == pytest.approx(best, abs=1e-5)
    assert event.score_margin == pytest.approx(best - rival, abs=1e-5)
    assert 0 < event.score_margin < 0.05          # why it missed: the margin was not met
    assert (result.score, result.score_margin) == (event.score, event.score_margin)


def test_clear_hit_without_rival_has_a_score_and_no_margin():
    table = {"stored": E0, "same answer": at_cosine(0.9), "asked": at_cosine(0.95)}
    cache, _, sink, _ = make_cache(table, multi_arm())
    cache.store("stored", "ans", unit_id="u")
    cache.store("same answer", "ans", unit_id="u")    # a neighbour that agrees is no rival
    result = cache.lookup("asked", unit_id="u")
    best = max(cos(table["asked"], table["stored"]), cos(table["asked"], table["same answer"]))
    assert result.hit and sink.events[-1].score == pytest.approx(best, abs=1e-5)
    assert sink.events[-1].score_margin is None and sink.events[-1].similarity_mode == "multi"


def test_nothing_past_the_cosine_gate_logs_no_score():
    cache, _, sink, _ = make_cache({"stored": E0, "asked": at_cosine(0.5)}, multi_arm())
    cache.store("stored", "ans", unit_id="u")
    result = cache.lookup("asked", unit_id="u")
    event = sink.events[-1]
    assert not result.hit and event.similarity == pytest.approx(0.5, abs=1e-5)
    assert event.similarity_mode == "multi" and event.score is None and event.score_margin is None


def test_cosine_arms_and_bypasses_log_null_scores():
    table = {"left": E0, "right": unit_vec(0.999, 0.0447), "asked": at_cosine(0.95)}
    cache, _, sink, exp = make_cache(table, ArmConfig(name="a", threshold=0.6), traffic_share=0.5)
    cache.store("left", "answer L", unit_id=unit_in_arm(exp, "a"))
    cache.store("right", "answer R", unit_id=unit_in_arm(exp, "a"))
    hit = cache.lookup("asked", unit_id=unit_in_arm(exp, "a"))
    bypass = cache.lookup("asked", unit_id=unit_in_arm(exp, "holdout"))
    assert hit.hit and bypass.decision == "bypass"
    for event in sink.events[-2:]:
        assert (event.similarity_mode, event.score, event.score_margin) == ("cosine", None, None)
    assert hit.score is None and hit.score_margin is None


def test_logged_score_and_margin_replay_other_multi_settings_offline():
    """Log with one multi setting, then predict from the events alone what other mixed-score
    thresholds and margins decide; a cache run with each of them must agree exactly."""
    rng = np.random.default_rng(5)
    anchors = [rng.standard_normal(8) for _ in range(4)]
    table, stored = {}, []
    for i in range(24):  # stored questions around 4 intents, answers mostly by intent
        vec = anchors[i % 4] + 0.45 * rng.standard_normal(8)
        table[f"stored question {i} about topic {i % 4}"] = vec
        stored.append((f"stored question {i} about topic {i % 4}", f"answer {i % 4 if i % 5 else i}"))
    queries = []
    for j in range(40):
        text = f"asked question {j} about topic {j % 4}"
        table[text] = anchors[j % 4] + 0.5 * rng.standard_normal(8)
        queries.append(text)
    weights = dict(token=0.3, phrase=0.6, intent=0.1)

    def decisions(threshold: float, margin: float) -> tuple[list[bool], list]:
        arm = multi_arm(threshold=threshold, answer_margin=margin, cosine=0.3, **weights)
        cache, _, sink, _ = make_cache(dict(table), arm)
        for query, answer in stored:
            cache.store(query, answer, unit_id="u")
        # Lookups do not change what later lookups see (no admission), so runs compare.
        hits = [cache.lookup(q, unit_id="u").hit for q in queries]
        return hits, sink.events[-len(queries):]

    _, logged = decisions(threshold=0.0, margin=0.0)
    assert sum(e.score is not None for e in logged) >= 20
    assert sum(e.score_margin is not None for e in logged) >= 10
    for threshold, margin in ((0.75, 0.0), (0.8, 0.05), (0.7, 0.1), (0.0, 0.04)):
        predicted = [e.score is not None and e.score >= threshold
                     and (e.score_margin is None or e.score_margin >= margin) for e in logged]
        actual, _ = decisions(threshold, margin)
        assert predicted == actual, (threshold, margin)
        assert 0 < sum(actual) < len(actual)       # the setting splits hits from misses
