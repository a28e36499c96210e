"""The thresholds a lookup is decided by: per arm, per intent cluster, per variant."""
from __future__ import annotations

from cache_core.experiments import ArmConfig, MultiSimilarityConfig, Variant


def threshold_for(arm: ArmConfig, cluster: int | None, variant: Variant = "base") -> float:
    """The cosine threshold: the canary's for canary units, else the cluster's override, else the arm's."""
    if variant == "canary" and arm.canary is not None:
        return arm.canary.threshold
    if cluster is not None and cluster in arm.cluster_thresholds:
        return arm.cluster_thresholds[cluster]
    return arm.threshold


def multi_for(arm: ArmConfig, variant: Variant = "base") -> MultiSimilarityConfig:
    """The multi settings the variant's units use: a canary may try another floor / margin."""
    if variant == "canary" and arm.canary is not None and arm.canary.multi_override:
        return arm.multi.model_copy(update=arm.canary.multi_override)
    return arm.multi
