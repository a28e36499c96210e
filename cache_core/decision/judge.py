"""The second stage of the hit rule: a learned judge picks which candidate, if any, is served.

The first stage (threshold, re-ranking, guards) proposes the candidates an arm *may*
serve; on an arm with a ``judge`` the threshold is a floor, not the rule. The judge reads
up to ``JudgeConfig.candidates`` of them at once (one encoder call) and gives each the
probability that its answer fits the new query (``judge_model``); the most probable is
served if it reaches the arm's operating point, else the lookup is a miss whose ``guard``
reads "judge". Picking the most probable, rather than trying candidates in cosine order
and falling through on a veto, keeps a vetoed best match from handing the hit to a
worse one.

When the arm's judge cannot be loaded (missing or corrupt artifact: logged once, retried
every 30 s) the arm keeps serving by its ``on_unavailable`` policy: "miss" (default:
nothing unjudged is served, so the error bound holds and the model answers everything)
or "threshold" (the cosine floor alone decides, as before the judge). Its lookups carry
``guard="judge_unavailable"`` so the dashboard shows the outage.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from cache_core.experiments import ArmConfig, JudgeConfig, Variant

JUDGE_VETO = "judge"
"""What a lookup's ``guard`` says when the judge found no candidate good enough."""
JUDGE_UNAVAILABLE = "judge_unavailable"
"""What it says when the arm's judge could not be loaded."""


class Judge(Protocol):
    version: str
    accept_at: float
    """Serve the most probable candidate when its probability is at least this."""

    def score_many(self, query: str, cached_queries: Sequence[str], cosines: Sequence[float]) -> np.ndarray:
        """Probability in [0, 1], per candidate, that its cached answer fits ``query``."""
        ...


@dataclass(frozen=True)
class Unavailable:
    """The arm names a judge that cannot be loaded now."""

    version: str
    on_unavailable: str


JudgeLookup = Callable[[ArmConfig, Variant], "Judge | Unavailable | None"]
"""How the rule finds an arm's judge for a variant: None when the arm has none."""


def judge_config(arm: ArmConfig, variant: Variant = "base") -> JudgeConfig | None:
    """The judge the variant's units use: a canary may try another version or operating point."""
    if variant == "canary" and arm.canary is not None and arm.canary.judge is not None:
        return arm.canary.judge
    return arm.judge


def no_judges(arm: ArmConfig, variant: Variant = "base") -> None:
    """The lookup for a cache built without a judge shelf: arms naming a judge are unavailable."""
    config = judge_config(arm, variant)
    return None if config is None else Unavailable(config.version, config.on_unavailable)


def shelf_judges(shelf) -> JudgeLookup:
    """A ``JudgeLookup`` over a ``judge_model.JudgeShelf``."""

    def lookup(arm: ArmConfig, variant: Variant = "base"):
        config = judge_config(arm, variant)
        if config is None:
            return None
        artifact = shelf.artifact(config.version)
        if artifact is None:
            return Unavailable(config.version, config.on_unavailable)
        cut = config.accept_at if config.accept_at is not None else artifact.accept_at(config.max_false_hit_rate)
        return shelf.judge(config.version, cut)

    return lookup
