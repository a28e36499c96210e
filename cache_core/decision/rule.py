"""``HitRule.decide``: the one place a lookup's candidates become a hit or a miss.

Stages, in order (the package docstring has the rule in words):
1. eligibility: the candidates at or above the arm's threshold (``thresholds``), best
   cosine first, or on a multi arm re-ranked by the mixed score and kept only if a clear
   winner (``rerank``);
2. guards: the arm's lexical guards may veto an eligible candidate (``guards``);
3. judge: a second-stage judge may veto it after them (``judge``).
The first eligible candidate no stage vetoes is served.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cache_core.decision.guards import first_conflict
from cache_core.decision.judge import JUDGE_VETO, NO_JUDGE, Judge, judge_for
from cache_core.decision.rerank import Weights, rank
from cache_core.decision.thresholds import multi_for, threshold_for
from cache_core.experiments import ArmConfig, Variant
from cache_core.types import Candidate


@dataclass
class Decision:
    """What the rule decided for one lookup."""

    threshold: float
    """The cosine threshold the lookup was decided by (arm, cluster, variant)."""
    served: Candidate | None = None
    """The candidate served; None: a miss."""
    guard: str | None = None
    """What vetoed the first blocked candidate (a guard's name or "judge"); None if nothing did."""
    eligible: list[Candidate] = field(default_factory=list)
    """The candidates that could be served, in the order they were tried."""
    score: float | None = None
    """Multi arms: the best-ranked candidate's mixed score (CacheEvent.score)."""
    score_margin: float | None = None
    """Multi arms: its lead over the best candidate with another answer (CacheEvent.score_margin)."""

    @property
    def hit(self) -> bool:
        return self.served is not None


class HitRule:
    """Decides lookups; stateless apart from how it finds an arm's judge (``judges``)."""

    def __init__(self, judges: Callable[[ArmConfig], Judge] = judge_for):
        self._judge_for = judges

    def decide(self, query: str, candidates: list[Candidate], arm: ArmConfig, cluster: int | None,
               variant: Variant = "base") -> Decision:
        """Serve the first eligible candidate that no guard and no judge vetoes.
        ``candidates``: the live ones the search found, best cosine first."""
        decision = self._eligible(query, candidates, arm, threshold_for(arm, cluster, variant), variant)
        judge = self._judge_for(arm)
        for candidate in decision.eligible:
            veto = first_conflict(query, candidate.entry.query, arm.guards)
            if veto is None and judge is not NO_JUDGE:
                probability = judge.score(query, candidate.entry.query, candidate.similarity,
                                          cached_answer=candidate.entry.answer)
                veto = None if probability >= judge.accept_at else JUDGE_VETO
            if veto is None:
                decision.served = candidate
                return decision
            decision.guard = decision.guard or veto
        return decision

    @staticmethod
    def _eligible(query: str, candidates: list[Candidate], arm: ArmConfig, threshold: float,
                  variant: Variant) -> Decision:
        """Candidates that may be served, best first: by cosine, or re-ranked (multi)."""
        if arm.similarity == "cosine":
            return Decision(threshold, eligible=[c for c in candidates if c.similarity >= threshold])
        multi = multi_for(arm, variant)
        ranked = rank(query, [c.entry.query for c in candidates],
                      [c.entry.answer for c in candidates], [c.similarity for c in candidates],
                      cosine_threshold=threshold, score_threshold=multi.threshold,
                      answer_margin=multi.answer_margin,
                      weights=Weights(token=multi.token, phrase=multi.phrase, intent=multi.intent),
                      lexical=multi.lexical)
        eligible = [candidates[r.index] for r in ranked if r.eligible]
        if not ranked:
            return Decision(threshold, eligible=eligible)
        # Whether the best-ranked candidate is eligible decides for the rest: so its score
        # and margin tell offline what any other mixed-score threshold / margin would have done.
        best = ranked[0]
        return Decision(threshold, eligible=eligible, score=float(best.score),
                        score_margin=None if best.margin is None else float(best.margin))
