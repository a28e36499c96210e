"""Multi-granularity re-ranking of a lookup's top-k candidates (ArmConfig.similarity="multi").

Plain cosine top-1 answers with whichever stored question is nearest, even when
two stored questions with different answers are about as near. The mixed score
(DESIGN.md: token, phrase and intent level, weights (0.3, 0.4, 0.3)) re-ranks the
candidates that pass the arm's cosine threshold:

* token level: Jaccard overlap of normalised word tokens (lower-cased [a-z0-9]+), or
  of character trigrams (``lexical="char3"``), which also credit shared stems and
  inflections ("cancel" / "cancelled") that whole-word overlap misses;
* phrase level: the embedding cosine;
* intent level: answer consensus, the share of the top-k's (non-negative) cosine
  mass held by candidates with the same answer text. Several close neighbours
  that agree on one answer are one intent; a lone neighbour among others that
  answer differently is not.

A candidate is served only if its mixed score is at least ``multi_threshold`` and
beats every candidate with a *different* answer by at least ``answer_margin``
(an ambiguous neighbourhood is a miss, not a coin toss). Pure functions: the cache
calls ``rank`` under the partition lock with texts and answers it already holds.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r"[a-z0-9]+")
_SPACE = re.compile(r"\s+")
LEXICAL_KINDS = ("word", "char3")


def tokens(text: str) -> frozenset[str]:
    """Normalised word tokens of ``text`` (case-folded, punctuation dropped)."""
    return frozenset(_TOKEN.findall(text.casefold()))


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|A ∩ B| / |A ∪ B|; 0.0 when both are empty."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def token_jaccard(left: str, right: str) -> float:
    """Jaccard overlap of ``tokens``; 0.0 when both are empty."""
    return _jaccard(tokens(left), tokens(right))


def char_grams(text: str, n: int = 3) -> frozenset[str]:
    """Character n-grams of the case-folded text, whitespace collapsed and padded so
    word starts and ends count."""
    padded = f" {_SPACE.sub(' ', text.casefold()).strip()} "
    return frozenset(padded[i:i + n] for i in range(len(padded) - n + 1))


def lexical_overlap(left: str, right: str, kind: str = "word") -> float:
    """Jaccard overlap of word tokens (``word``) or character trigrams (``char3``)."""
    if kind == "word":
        return token_jaccard(left, right)
    if kind == "char3":
        return _jaccard(char_grams(left), char_grams(right))
    raise ValueError(f"unknown lexical kind {kind!r}; expected one of {LEXICAL_KINDS}")


def answer_consensus(answers: list[str], cosines: list[float]) -> list[float]:
    """For each candidate, the share of the (clipped at 0) cosine mass of all
    candidates whose answer equals its own."""
    mass = [max(c, 0.0) for c in cosines]
    total = sum(mass)
    if total <= 0:
        return [0.0] * len(answers)
    by_answer: dict[str, float] = {}
    for answer, m in zip(answers, mass):
        by_answer[answer] = by_answer.get(answer, 0.0) + m
    return [by_answer[a] / total for a in answers]


@dataclass(frozen=True)
class Weights:
    token: float = 0.3
    phrase: float = 0.4
    intent: float = 0.3

    @classmethod
    def of(cls, levels) -> "Weights":
        """The weights of anything with ``token``, ``phrase`` and ``intent`` (an arm's
        ``MultiSimilarityConfig``)."""
        return cls(token=levels.token, phrase=levels.phrase, intent=levels.intent)


@dataclass(frozen=True)
class Ranked:
    """One candidate's position after re-ranking (``index`` into the input lists)."""

    index: int
    score: float
    eligible: bool
    """Passes the cosine threshold, the mixed-score threshold and the answer margin."""
    margin: float | None = None
    """Its lead over the best candidate (past the cosine threshold) with another answer,
    what ``answer_margin`` is compared with; None when there is no such rival."""


def mixed_scores(query: str, texts: list[str], answers: list[str], cosines: list[float],
                 weights: Weights, lexical: str = "word") -> list[float]:
    """weights.token * lexical overlap + weights.phrase * cosine + weights.intent * consensus."""
    consensus = answer_consensus(answers, cosines)
    return [weights.token * lexical_overlap(query, text, lexical) + weights.phrase * cos
            + weights.intent * share
            for text, cos, share in zip(texts, cosines, consensus)]


def rank(query: str, texts: list[str], answers: list[str], cosines: list[float], *,
         cosine_threshold: float, score_threshold: float, answer_margin: float,
         weights: Weights = Weights(), lexical: str = "word") -> list[Ranked]:
    """Candidates above ``cosine_threshold``, best mixed score first, each marked
    eligible or not. Candidates below the cosine threshold still count toward
    consensus (they are neighbours) but are never served."""
    scores = mixed_scores(query, texts, answers, cosines, weights, lexical)
    gated = [i for i, cos in enumerate(cosines) if cos >= cosine_threshold]
    gated.sort(key=lambda i: -scores[i])
    out = []
    for i in gated:
        rival = max((scores[j] for j in gated if answers[j] != answers[i]), default=None)
        margin = None if rival is None else scores[i] - rival
        clear = margin is None or margin >= answer_margin
        out.append(Ranked(index=i, score=scores[i], eligible=scores[i] >= score_threshold and clear,
                          margin=margin))
    return out
