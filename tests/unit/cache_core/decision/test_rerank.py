"""Re-rank scoring (pure functions) and the multi-similarity decision in the cache."""
from __future__ import annotations

import pytest

from cache_core.experiments import ArmConfig, MultiSimilarityConfig
from cache_core.decision.rerank import (Weights, answer_consensus, char_grams, lexical_overlap,
                                   mixed_scores, rank, token_jaccard, tokens)
from tests.unit.cache_core.helpers import at_cosine, unit_vec
from tests.unit.cache_core.test_cache import E0, make_cache


def test_tokens_are_case_and_punctuation_free():
    assert tokens("Reset my PASSWORD, please!") == {"reset", "my", "password", "please"}
    assert token_jaccard("reset my password", "Reset my password?") == 1.0
    assert token_jaccard("reset my password", "close my account") == pytest.approx(1 / 5)
    assert token_jaccard("", "...") == 0.0


def test_char_trigrams_credit_shared_stems_that_words_miss():
    assert char_grams("Ab  c") == {" ab", "ab ", "b c", " c "}
    inflected = ("cancel my transfer", "cancelled transfers")
    assert token_jaccard(*inflected) == 0.0
    assert lexical_overlap(*inflected, kind="char3") > 0.4
    assert lexical_overlap("same text", "Same   TEXT", kind="char3") == 1.0
    assert lexical_overlap("", "", kind="char3") == 0.0
    assert lexical_overlap(*inflected, kind="word") == token_jaccard(*inflected)
    with pytest.raises(ValueError, match="unknown lexical kind"):
        lexical_overlap("a", "b", kind="char4")


def test_rank_with_char_trigrams_picks_the_inflected_paraphrase():
    query, texts = "cancelled card payment", ["cancel a card payment", "card payment pending"]
    kwargs = dict(cosine_threshold=0.6, score_threshold=0.0, answer_margin=0.0,
                  weights=Weights(token=0.5, phrase=0.6, intent=0.0))
    by_word = rank(query, texts, ["cancel", "pending"], [0.80, 0.81], lexical="word", **kwargs)
    by_char = rank(query, texts, ["cancel", "pending"], [0.80, 0.81], lexical="char3", **kwargs)
    assert by_word[0].index == 1 and by_char[0].index == 0


def test_answer_consensus_shares_cosine_mass_by_answer():
    shares = answer_consensus(["x", "y", "x"], [0.9, 0.6, 0.5])
    assert shares == pytest.approx([1.4 / 2.0, 0.6 / 2.0, 1.4 / 2.0])
    assert answer_consensus(["x", "y"], [-0.2, 0.0]) == [0.0, 0.0]  # no positive mass


def test_mixed_score_is_the_weighted_sum():
    scores = mixed_scores("reset my password", ["reset my password", "close my account"],
                          ["a", "b"], [0.8, 0.6], Weights(token=0.3, phrase=0.4, intent=0.3))
    assert scores[0] == pytest.approx(0.3 * 1.0 + 0.4 * 0.8 + 0.3 * 0.8 / 1.4)
    assert scores[1] == pytest.approx(0.3 * 0.2 + 0.4 * 0.6 + 0.3 * 0.6 / 1.4)


def test_rank_prefers_lexical_agreement_over_a_slightly_higher_cosine():
    ranked = rank("how do I reset my password", ["how can I reset my password", "change my pin code"],
                  ["reset", "pin"], [0.80, 0.82], cosine_threshold=0.6, score_threshold=0.0,
                  answer_margin=0.0, weights=Weights(token=0.5, phrase=0.5, intent=0.0))
    assert [r.index for r in ranked] == [0, 1] and ranked[0].eligible
    assert not ranked[1].eligible  # it loses to a rival with another answer


def test_rank_refuses_an_ambiguous_winner_but_not_agreeing_neighbours():
    kwargs = dict(cosine_threshold=0.6, score_threshold=0.0, answer_margin=0.05,
                  weights=Weights(token=0.0, phrase=1.0, intent=0.0))
    close_rivals = rank("q", ["a", "b"], ["x", "y"], [0.90, 0.88], **kwargs)
    assert not any(r.eligible for r in close_rivals)
    same_answer = rank("q", ["a", "b"], ["x", "x"], [0.90, 0.88], **kwargs)
    assert all(r.eligible for r in same_answer)


def test_rank_gates_on_cosine_and_score_thresholds():
    kwargs = dict(answer_margin=0.0, weights=Weights(token=0.0, phrase=1.0, intent=0.0))
    below = rank("q", ["a", "b"], ["x", "y"], [0.59, 0.3], cosine_threshold=0.6,
                 score_threshold=0.0, **kwargs)
    assert below == []
    ranked = rank("q", ["a"], ["x"], [0.7], cosine_threshold=0.6, score_threshold=0.75, **kwargs)
    assert len(ranked) == 1 and not ranked[0].eligible


def test_multi_arm_misses_when_two_answers_are_about_as_near():
    multi = ArmConfig(name="a", threshold=0.6, similarity="multi",
                      multi=MultiSimilarityConfig(token=0.0, phrase=1.0, intent=0.0,
                                                  threshold=0.0, answer_margin=0.05))
    table = {"left": E0, "right": unit_vec(0.999, 0.0447), "asked": at_cosine(0.95)}
    cache, _, sink, _ = make_cache(table, multi)
    cache.store("left", "answer L", unit_id="u")
    cache.store("right", "answer R", unit_id="u")
    result = cache.lookup("asked", unit_id="u")
    assert not result.hit and result.decision == "miss" and result.similarity > 0.9
    plain, _, _, _ = make_cache(dict(table), ArmConfig(name="a", threshold=0.6))
    plain.store("left", "answer L", unit_id="u")
    plain.store("right", "answer R", unit_id="u")
    assert plain.lookup("asked", unit_id="u").hit  # cosine top-1 serves one of them anyway
    assert sink.events[-1].similarity == pytest.approx(result.similarity)


def test_multi_arm_serves_a_clear_winner_and_logs_its_cosine():
    multi = ArmConfig(name="a", threshold=0.6, similarity="multi")
    cache, _, _, _ = make_cache({"stored": E0, "asked": at_cosine(0.9), "far": unit_vec(0, 0, 1)}, multi)
    cache.store("stored", "ans", unit_id="u")
    cache.store("far", "other", unit_id="u")
    result = cache.lookup("asked", unit_id="u")
    assert result.hit and result.answer == "ans"
    assert result.event.similarity == pytest.approx(0.9, abs=1e-5)


def test_multi_lexical_kind_is_validated():
    assert MultiSimilarityConfig().lexical == "char3"
    with pytest.raises(ValueError):
        MultiSimilarityConfig(lexical="bigram")


def test_multi_weights_must_not_all_be_zero():
    with pytest.raises(ValueError, match="positive weight"):
        MultiSimilarityConfig(token=0.0, phrase=0.0, intent=0.0)
