"""``HitRule.decide``: the one place a lookup's candidates become a hit or a miss.

Stages, in order (the package docstring has the rule in words):
1. eligibility: the candidates at or above the arm's threshold (``thresholds``), best
   cosine first, or on a multi arm re-ranked by the mixed score and kept only if a clear
   winner (``rerank``);
2. guards: the arm's lexical guards may veto an eligible candidate (``guards``);
3. judge: on an arm with one, the judge picks the most probable of the candidates the
   guards let through and serves it if it reaches the operating point (``judge``).
Without a judge, the first eligible candidate no guard vetoes is served.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from cache_core.decision.guards import first_conflict
from cache_core.decision.judge import (JUDGE_UNAVAILABLE, JUDGE_VETO, Judge, JudgeLookup, Unavailable,
                                       judge_config, no_judges)
from cache_core.decision.rerank import Weights, rank
from cache_core.decision.thresholds import multi_for, threshold_for
from cache_core.experiments import ArmConfig, Variant
from cache_core.records import Candidate


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
    judge_version: str | None = None
    """The judge that decided (None: no judge on this arm)."""
    judge_probability: float | None = None
    """Its probability for the most probable candidate (served or not)."""
    judge_ms: float | None = None
    """Time the judge took (token vectors and trees)."""

    @property
    def hit(self) -> bool:
        return self.served is not None


class HitRule:
    """Decides lookups; stateless apart from how it finds an arm's judge (``judges``)."""

    def __init__(self, judges: JudgeLookup = no_judges):
        self._judges = judges

    def decide(self, query: str, candidates: list[Candidate], arm: ArmConfig, cluster: int | None,
               variant: Variant = "base") -> Decision:
        """Serve an eligible candidate no guard vetoes, chosen by the arm's judge if it has one.
        ``candidates``: the live ones the search found, best cosine first."""
        decision = self._eligible(query, candidates, arm, threshold_for(arm, cluster, variant), variant)
        judge = self._judges(arm, variant) if judge_config(arm, variant) is not None else None
        allowed = []
        for candidate in decision.eligible:
            veto = first_conflict(query, candidate.entry.query, arm.guards)
            if veto is None:
                if judge is None or (isinstance(judge, Unavailable) and judge.on_unavailable == "threshold"):
                    decision.served = candidate
                    break
                allowed.append(candidate)
            else:
                decision.guard = decision.guard or veto
        if isinstance(judge, Unavailable):
            decision.judge_version = judge.version
            if decision.served is None and (allowed or decision.eligible):
                decision.guard = decision.guard or JUDGE_UNAVAILABLE
            return decision
        if judge is not None and allowed:
            self._judge(query, allowed[:judge_config(arm, variant).candidates], judge, decision)
        return decision

    @staticmethod
    def _judge(query: str, allowed: list[Candidate], judge: Judge, decision: Decision) -> None:
        started = time.perf_counter()
        probabilities = judge.score_many(query, [c.entry.query for c in allowed],
                                         [c.similarity for c in allowed])
        best = int(probabilities.argmax())
        decision.judge_version = judge.version
        decision.judge_probability = float(probabilities[best])
        decision.judge_ms = (time.perf_counter() - started) * 1e3
        if probabilities[best] >= judge.accept_at:
            decision.served = allowed[best]
        else:
            decision.guard = decision.guard or JUDGE_VETO
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
