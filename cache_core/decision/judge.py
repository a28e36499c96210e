"""The second stage of the hit rule: a judge that may veto a candidate the first stage
(threshold, re-ranking, guards) would serve.

A judge gives the probability that the cached question's answer is right for the new
query; below its ``accept_at`` the candidate is vetoed (the lookup's ``guard`` reads
"judge" if no earlier candidate was blocked by a guard). ``judge_for`` is where an arm's
config names its judge; until one does, every arm gets ``NO_JUDGE``, which the rule
does not even call.
"""
from __future__ import annotations

from typing import Protocol

from cache_core.experiments import ArmConfig

JUDGE_VETO = "judge"
"""What a lookup's ``guard`` says when the judge vetoed the first blocked candidate."""


class Judge(Protocol):
    accept_at: float
    """Serve when ``score`` is at least this."""

    def score(self, query: str, cached_query: str, cosine: float, *, cached_answer: str) -> float:
        """Probability in [0, 1] that ``cached_answer`` (stored for ``cached_query``) answers ``query``."""
        ...


class NoJudge:
    """No second stage: every candidate the first stage selects is served."""

    accept_at = 0.0

    def score(self, query: str, cached_query: str, cosine: float, *, cached_answer: str) -> float:
        return 1.0


NO_JUDGE = NoJudge()


def judge_for(arm: ArmConfig) -> Judge:
    """The judge ``arm``'s lookups go through (none is configurable yet)."""
    return NO_JUDGE
