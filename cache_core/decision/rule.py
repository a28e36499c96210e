"""``HitRule.decide``: the one place a lookup's candidates become a hit or a miss.

Stages, in order (the package docstring has the rule in words):
1. eligibility: the candidates at or above the arm's threshold (``thresholds``), best
   cosine first, or on a multi arm re-ranked by the mixed score and kept only if a clear
   winner (``rerank``);
2. guards: the arm's lexical guards may veto an eligible candidate (``guards``);
3. judge: on an arm with one, the judge picks the most probable of the candidates the
   guards let through and serves it if it reaches the operating point (``judge``).
Without a judge, the first eligible candidate no guard vetoes is served.

The threshold of stage 1 is the arm's (``thresholds``), or on an arm with an
``error_bounded`` threshold policy each candidate's own, learnt from verdicts on its entry,
its intent cluster or the arm (``error_bound``; canary units keep the canary's threshold).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from cache_core.decision.error_bound import ThresholdSource, VerdictBook
from cache_core.decision.guards import first_conflict
from cache_core.decision.judge import (JUDGE_UNAVAILABLE, JUDGE_VETO, Judge, JudgeLookup, Unavailable,
                                       judge_config, no_judges)
from cache_core.decision.rerank import Weights, rank
from cache_core.decision.thresholds import multi_for, threshold_for
from cache_core.experiments import ArmConfig, ErrorBoundedThresholds, Variant
from cache_core.records import Candidate


@dataclass
class Decision:
    """What the rule decided for one lookup."""

    threshold: float
    """The cosine threshold the lookup was decided by (arm, cluster, variant; on an error-bounded
    arm the served candidate's, or on a miss the nearest candidate's)."""
    threshold_source: ThresholdSource | None = None
    """Error-bounded arms: which level set ``threshold`` (entry, cluster, arm or static)."""
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
    """Decides lookups. Its state: how it finds an arm's judge (``judges``) and the verdicts
    error-bounded arms learn their thresholds from (``verdicts``, fed by the cache's
    ``apply`` of ``Verdict`` changes)."""

    def __init__(self, judges: JudgeLookup = no_judges, verdicts: VerdictBook | None = None):
        self._judges = judges
        self.verdicts = verdicts if verdicts is not None else VerdictBook()

    def decide(self, query: str, candidates: list[Candidate], arm: ArmConfig, cluster: int | None,
               variant: Variant = "base", experiment_id: str = "") -> Decision:
        """Serve an eligible candidate no guard vetoes, chosen by the arm's judge if it has one.
        ``candidates``: the live ones the search found, best cosine first."""
        bounds = self._bounds(candidates, arm, cluster, variant, experiment_id)
        static = threshold_for(arm, cluster, variant)
        decision = self._eligible(query, candidates, arm, static if bounds is None else bounds[0][0], variant,
                                  None if bounds is None else [t for t, _ in bounds])
        self._serve(query, decision, arm, variant)
        if bounds is not None:  # the threshold the served (or, on a miss, the nearest) candidate had
            at = next((i for i, c in enumerate(candidates) if c is decision.served), 0)
            decision.threshold, decision.threshold_source = bounds[at]
        return decision

    def _bounds(self, candidates: list[Candidate], arm: ArmConfig, cluster: int | None, variant: Variant,
                experiment_id: str) -> list[tuple[float, ThresholdSource]] | None:
        """Error-bounded arms: each candidate's learnt threshold and its level (one for the
        query's cluster when there is no candidate), before it is learnt the arm's threshold raised to
        the policy's ``start_threshold``; None on other arms and canary units."""
        policy = arm.threshold_policy
        if not isinstance(policy, ErrorBoundedThresholds) or (variant == "canary" and arm.canary is not None):
            return None
        static = max(threshold_for(arm, cluster, variant), policy.start_threshold)  # the cold start
        if not candidates:
            return [self.verdicts.threshold(experiment_id, arm.name, policy, "", -1 if cluster is None else cluster,
                                            static)]
        return [self.verdicts.threshold(experiment_id, arm.name, policy, c.entry.entry_id, c.entry.intent_cluster,
                                        static) for c in candidates]

    def _serve(self, query: str, decision: Decision, arm: ArmConfig, variant: Variant) -> None:
        """Stages 2 and 3: guards, then the judge, over the eligible candidates."""
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
            return
        if judge is not None and allowed:
            self._judge(query, allowed[:judge_config(arm, variant).candidates], judge, decision)

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
                  variant: Variant, own: list[float] | None = None) -> Decision:
        """Candidates that may be served, best first: by cosine (against ``own``, each candidate's
        threshold, when given), or re-ranked (multi: ``threshold``, the nearest candidate's, for all)."""
        if arm.similarity == "cosine" and own is not None:
            # Only a prefix: a candidate its own threshold refuses also blocks the less similar ones
            # (verdicts measure the nearest candidate; serving the next one instead is another,
            # worse population, the fall-through the guards showed on held-out data).
            eligible = []
            for candidate, cut in zip(candidates, own):
                if candidate.similarity < cut:
                    break
                eligible.append(candidate)
            return Decision(threshold, eligible=eligible)
        if arm.similarity == "cosine":
            return Decision(threshold, eligible=[c for c in candidates if c.similarity >= threshold])
        multi = multi_for(arm, variant)
        ranked = rank(query, [c.entry.query for c in candidates],
                      [c.entry.answer for c in candidates], [c.similarity for c in candidates],
                      cosine_threshold=threshold, score_threshold=multi.threshold,
                      answer_margin=multi.answer_margin,
                      weights=Weights.of(multi),
                      lexical=multi.lexical)
        eligible = [candidates[r.index] for r in ranked if r.eligible]
        if not ranked:
            return Decision(threshold, eligible=eligible)
        # Whether the best-ranked candidate is eligible decides for the rest: so its score
        # and margin tell offline what any other mixed-score threshold / margin would have done.
        best = ranked[0]
        return Decision(threshold, eligible=eligible, score=float(best.score),
                        score_margin=None if best.margin is None else float(best.margin))
