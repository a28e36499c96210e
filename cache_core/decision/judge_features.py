"""What the learned judge looks at for one (cached question, new question) pair.

A sentence cosine says two questions are about the same thing; whether they are the *same
question* is decided by the words they do not share. "How do I learn Python?" and "How do
I learn Java?" sit at cosine 0.7 with one content word each that the other lacks and that
nothing in the other sentence stands for. So beside the cosine the judge reads:

* word alignment (BERTScore-like, Zhang et al. 2020) over the encoder's contextual token
  vectors: how well each content word piece of one question is matched by some piece of
  the other, on average and at the *worst-matched* word, and how many are left unmatched;
* lexical overlap of words, content words and character trigrams, and the count of
  content words only one side has;
* conflicts a paraphrase never has: different numbers, negation on one side only,
  different question words (what / how / why ...), very different lengths.

Pure functions over texts and token vectors: the same code computes training features
(``cache_core.decision.judge_train``) and serving features (``cache_core.decision.judge_model``),
so the two cannot drift apart. ``FEATURE_NAMES`` is stored in every artifact and checked on load.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

FEATURE_NAMES = (
    "cosine",
    "align_precision", "align_recall", "align_f1",
    "align_worst", "align_worst2", "unaligned",
    "word_jaccard", "content_jaccard", "char3_jaccard", "content_only_one_side",
    "length_ratio", "numbers_differ", "negation_differs", "question_word_differs",
)
"""Feature order of the vectors ``pair_features`` returns (artifacts pin it)."""
TUNED_FEATURE_NAMES = FEATURE_NAMES + ("judge_encoder_cosine",)
"""A judge with its own encoder, fine-tuned on the user's pairs (``judge_encoder_tuning``): the
same features over that encoder's token vectors, and its sentence cosine last."""

STOP_WORDS = frozenset("""a an the of to in on for and or is are was were be been do does did i you he she it we they
me my your our their this that these those what how why when where who which can could would should will shall may
might with at by from as about into than then there here if so just get have has had am any some not no""".split())
NEGATIONS = frozenset({"not", "no", "never", "cannot", "dont", "doesnt", "didnt", "isnt", "arent", "wasnt", "cant",
                       "wont", "nt"})
QUESTION_WORDS = frozenset({"what", "how", "why", "when", "where", "who", "which", "whom", "whose"})
UNALIGNED_BELOW = 0.6
"""A content piece whose best match in the other question is below this counts as unmatched."""

_WORD = re.compile(r"[a-z0-9]+")
_PIECE = re.compile(r"(##)?[a-z0-9]+")


class TokenVectors:
    """One text's contextual token vectors (unit length): all word pieces, and the content ones;
    and its sentence vector (unit length; the encoder's mean pooling over the raw token vectors,
    else the mean of the unit ones)."""

    __slots__ = ("all", "content", "sentence")

    def __init__(self, vectors: np.ndarray, pieces: list[str], sentence: np.ndarray | None = None):
        pooled = vectors.mean(axis=0) if sentence is None else sentence
        self.sentence = pooled / max(float(np.linalg.norm(pooled)), 1e-9)
        keep = [i for i, p in enumerate(pieces) if _PIECE.fullmatch(p)]
        content = [i for i in keep if p_word(pieces[i]) not in STOP_WORDS]
        base = vectors[keep] if keep else vectors
        self.all = base
        self.content = vectors[content] if content else base


TokenEncoder = Callable[[Sequence[str]], list[TokenVectors]]
"""Texts -> their contextual token vectors (``judge_tokens`` builds them from an encoder)."""


def p_word(piece: str) -> str:
    """A word piece without its continuation mark."""
    return piece[2:] if piece.startswith("##") else piece


def words(text: str) -> set[str]:
    """Lower-cased alphanumeric words; apostrophes dropped so "don't" reads "dont"."""
    return set(_WORD.findall(text.casefold().replace("'", "").replace("\u2019", "")))


def _jaccard(a: set, b: set) -> float:
    union = len(a | b)
    return len(a & b) / union if union else 1.0


def _char3(text: str) -> set[str]:
    padded = " " + " ".join(text.casefold().split()) + " "
    return {padded[i:i + 3] for i in range(len(padded) - 2)}


def pair_features(cached: str, query: str, cosine: float, cached_tokens: TokenVectors,
                  query_tokens: TokenVectors, *, encoder_cosine: bool = False) -> list[float]:
    """The ``FEATURE_NAMES`` vector for one pair (``TUNED_FEATURE_NAMES`` with ``encoder_cosine``:
    the token vectors' own sentence cosine appended)."""
    sims = cached_tokens.content @ query_tokens.content.T
    cached_best, query_best = sims.max(axis=1), sims.max(axis=0)
    both = np.sort(np.concatenate([cached_best, query_best]))
    full = cached_tokens.all @ query_tokens.all.T
    precision, recall = float(full.max(axis=1).mean()), float(full.max(axis=0).mean())
    wc, wq = words(cached), words(query)
    kc, kq = wc - STOP_WORDS, wq - STOP_WORDS
    return [
        float(cosine),
        precision, recall, 2 * precision * recall / max(precision + recall, 1e-9),
        float(both[0]), float(both[:2].mean()), float((both < UNALIGNED_BELOW).sum()),
        _jaccard(wc, wq), _jaccard(kc, kq), _jaccard(_char3(cached), _char3(query)),
        float(len(kc ^ kq)),
        min(len(wc), len(wq)) / max(len(wc), len(wq), 1),
        float({w for w in wc if w.isdigit()} != {w for w in wq if w.isdigit()}),
        float(bool(wc & NEGATIONS) != bool(wq & NEGATIONS)),
        float((wc & QUESTION_WORDS) != (wq & QUESTION_WORDS)),
    ] + ([float(cached_tokens.sentence @ query_tokens.sentence)] if encoder_cosine else [])
