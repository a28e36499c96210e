"""Config edits, free of any I/O: each ``Change`` is a pure function of an experiment's config.

An arm threshold, a cluster threshold, a canary start / promote / rollback, a multi arm's
score floor / answer margin, feedback invalidation, or a restore of an earlier config's
thresholds. ``publishing.publish_change`` applies one to the live config, bumps the
version and publishes it; ``changed_arms`` and ``previous_config`` say what a push
changed and what a rollback returns to.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable

import pandas as pd
from pydantic import ValidationError

from cache_core.decision.thresholds import multi_for
from cache_core.experiments import ArmConfig, CanaryConfig, ExperimentConfig, JudgeConfig, MultiSimilarityConfig


Change = Callable[[ExperimentConfig], ExperimentConfig]
"""A pure edit of a config's arms (the version bump is done by publish_change)."""


def validate_threshold(value: object) -> float:
    """A finite number in [0, 1], or a ValueError saying what was wrong."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"threshold must be a number, got {value!r}")
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"threshold must be between 0 and 1, got {value}")
    return float(value)


def _replace_arm(config: ExperimentConfig, arm: str, **fields) -> ExperimentConfig:
    names = [a.name for a in config.arms]
    if arm not in names:
        raise ValueError(f"experiment {config.experiment_id!r} has no arm {arm!r}; arms: {names}")
    data = config.model_dump()
    for arm_data in data["arms"]:
        if arm_data["name"] == arm:
            arm_data.update(fields)
    return ExperimentConfig.model_validate(data)


def bumped(config: ExperimentConfig, version: int, actor: str, at_ms: int) -> ExperimentConfig:
    """A copy of ``config`` at ``version``, updated by ``actor`` at ``at_ms``."""
    return config.model_copy(update={"version": version, "updated_by": actor, "updated_at_ms": at_ms})


def set_threshold(arm: str, threshold: float) -> Change:
    """Change ``arm``'s threshold (its cluster thresholds and canary stay)."""
    value = validate_threshold(threshold)
    return lambda config: _replace_arm(config, arm, threshold=value)


def set_cluster_threshold(arm: str, cluster: int, threshold: float | None) -> Change:
    """Set (or with None, remove) ``arm``'s threshold for one intent cluster."""
    if isinstance(cluster, bool) or not isinstance(cluster, int) or cluster < 0:
        raise ValueError(f"intent cluster must be a non-negative integer, got {cluster!r}")
    value = None if threshold is None else validate_threshold(threshold)

    def change(config: ExperimentConfig) -> ExperimentConfig:
        clusters = dict(config.arm(arm).cluster_thresholds) if arm in arm_names(config) else {}
        if value is None:
            clusters.pop(cluster, None)
        else:
            clusters[cluster] = value
        return _replace_arm(config, arm, cluster_thresholds=clusters)
    return change


def start_canary(arm: str, threshold: float, share: float, target_false_hit_rate: float,
                 at_ms: int) -> Change:
    """Try ``threshold`` on a ``share`` of ``arm``'s units first (replaces a running canary)."""
    canary = CanaryConfig(threshold=validate_threshold(threshold), share=_share(share),
                          target_false_hit_rate=_target(target_false_hit_rate), started_at_ms=at_ms)
    return lambda config: _replace_arm(config, arm, canary=canary.model_dump())


def start_multi_canary(arm: str, share: float, target_false_hit_rate: float, at_ms: int, *,
                       score_floor: float | None = None, answer_margin: float | None = None) -> Change:
    """Try a multi arm's new score floor and/or answer margin on a ``share`` of its units
    first, at the arm's cosine threshold (replaces a running canary). Refuses what
    ``set_multi`` refuses."""
    as_pushed = set_multi(arm, score_floor=score_floor, answer_margin=answer_margin)
    share, target = _share(share), _target(target_false_hit_rate)

    def change(config: ExperimentConfig) -> ExperimentConfig:
        multi = as_pushed(config).arm(arm).multi
        canary = CanaryConfig(threshold=config.arm(arm).threshold, share=share, target_false_hit_rate=target,
                              started_at_ms=at_ms,
                              score_floor=None if score_floor is None else multi.threshold,
                              answer_margin=None if answer_margin is None else multi.answer_margin)
        return _replace_arm(config, arm, canary=canary.model_dump())
    return change


def promote_canary(arm: str) -> Change:
    """The canary's threshold (and score floor / answer margin, judge) become the arm's; the canary ends."""
    def change(config: ExperimentConfig) -> ExperimentConfig:
        canary = _running_canary(config, arm)
        multi = {"multi": multi_for(config.arm(arm), "canary").model_dump()} if canary.multi_override else {}
        judge = {"judge": canary.judge.model_dump()} if canary.judge is not None else {}
        return _replace_arm(config, arm, threshold=canary.threshold, canary=None, **multi, **judge)
    return change


def _judged(config: ExperimentConfig, arm: str) -> JudgeConfig:
    judge = config.arm(arm).judge
    if judge is None:
        raise ValueError(f"arm {arm!r} has no judge: its operating point cannot be set")
    return judge


def _cut(accept_at: object) -> float:
    if isinstance(accept_at, bool) or not isinstance(accept_at, (int, float)) or not 0.0 <= accept_at <= 1.0:
        raise ValueError(f"a judge's accept_at must be a number in [0, 1], got {accept_at!r}")
    return float(accept_at)


def set_judge_cut(arm: str, accept_at: float) -> Change:
    """A judged arm's operating point becomes the explicit probability cut ``accept_at``."""
    cut = _cut(accept_at)

    def change(config: ExperimentConfig) -> ExperimentConfig:
        judge = _judged(config, arm).model_copy(update={"accept_at": cut})
        return _replace_arm(config, arm, judge=judge.model_dump())
    return change


def start_judge_canary(arm: str, accept_at: float, share: float, target_false_hit_rate: float,
                       at_ms: int) -> Change:
    """Try the judge's cut ``accept_at`` (same version, same cosine floor) on a ``share`` of the arm's
    units first (replaces a running canary); ``promote_canary`` makes it the arm's."""
    cut, share, target = _cut(accept_at), _share(share), _target(target_false_hit_rate)

    def change(config: ExperimentConfig) -> ExperimentConfig:
        judge = _judged(config, arm).model_copy(update={"accept_at": cut})
        canary = CanaryConfig(threshold=config.arm(arm).threshold, share=share, target_false_hit_rate=target,
                              started_at_ms=at_ms, judge=judge)
        return _replace_arm(config, arm, canary=canary.model_dump())
    return change


def rollback_canary(arm: str) -> Change:
    """End the canary; every unit of the arm goes back to the arm's threshold."""
    def change(config: ExperimentConfig) -> ExperimentConfig:
        _running_canary(config, arm)
        return _replace_arm(config, arm, canary=None)
    return change


def restore_thresholds(previous: ExperimentConfig) -> Change:
    """Thresholds, cluster thresholds, multi settings (score floor, answer margin...) and
    feedback invalidation of ``previous`` for every arm both configs have; running canaries
    end (a rollback returns to a known state, not to an experiment)."""
    def change(config: ExperimentConfig) -> ExperimentConfig:
        for arm in config.arms:
            if arm.name in arm_names(previous):
                old = previous.arm(arm.name)
                config = _replace_arm(config, arm.name, threshold=old.threshold,
                                      cluster_thresholds=dict(old.cluster_thresholds), canary=None,
                                      multi=old.multi.model_dump(),
                                      invalidate_after_wrong=old.invalidate_after_wrong)
        return config
    return change


_MULTI_LABELS = {"threshold": "score floor", "answer_margin": "answer margin"}


def set_multi(arm: str, *, score_floor: float | None = None, answer_margin: float | None = None) -> Change:
    """Change a multi arm's mixed-score floor and/or answer margin (weights, lexical level,
    thresholds and canary stay). Refuses a cosine arm, values outside the
    MultiSimilarityConfig bounds, and a change that leaves both as they are."""
    updates: dict[str, float] = {}
    for field, value in (("threshold", score_floor), ("answer_margin", answer_margin)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{_MULTI_LABELS[field]} must be a finite number, got {value!r}")
        updates[field] = float(value)
    if not updates:
        raise ValueError("give a new score floor and/or answer margin")

    def change(config: ExperimentConfig) -> ExperimentConfig:
        if arm not in arm_names(config):
            raise ValueError(f"experiment {config.experiment_id!r} has no arm {arm!r}; arms: {arm_names(config)}")
        current = config.arm(arm)
        if current.similarity != "multi":
            raise ValueError(f"arm {arm!r} uses {current.similarity} similarity: only a multi arm has a "
                             "score floor and answer margin to change")
        try:  # the model's own bounds, so the panel and the cache agree on what is valid
            multi = MultiSimilarityConfig.model_validate({**current.multi.model_dump(), **updates})
        except ValidationError as exc:
            raise ValueError("; ".join(f"{_MULTI_LABELS.get(str(e['loc'][0]), e['loc'][0])}: {e['msg']}"
                                       for e in exc.errors())) from None
        if multi == current.multi:
            raise ValueError(f"arm {arm!r} already has score floor {multi.threshold:.3f} and answer margin "
                             f"{multi.answer_margin:.3f}; nothing to push")
        return _replace_arm(config, arm, multi=multi.model_dump())
    return change


def set_invalidate_after(arm: str, users: int) -> Change:
    """Change how many users must get a "wrong" verdict on an entry's answers before feedback
    removes it (``ArmConfig.invalidate_after_wrong``; 0: never). Refuses a no-op."""
    if isinstance(users, bool) or not isinstance(users, int) or users < 0:
        raise ValueError(f"the number of users must be a whole number >= 0, got {users!r}")

    def change(config: ExperimentConfig) -> ExperimentConfig:
        if arm not in arm_names(config):
            raise ValueError(f"experiment {config.experiment_id!r} has no arm {arm!r}; arms: {arm_names(config)}")
        if config.arm(arm).invalidate_after_wrong == users:
            raise ValueError(f"arm {arm!r} already removes entries after {users} users' wrong verdicts; "
                             "nothing to push")
        return _replace_arm(config, arm, invalidate_after_wrong=users)
    return change


def arm_names(config: ExperimentConfig) -> list[str]:
    """The names of ``config``'s arms, in order."""
    return [a.name for a in config.arms]


def _running_canary(config: ExperimentConfig, arm: str) -> CanaryConfig:
    if arm not in arm_names(config):
        raise ValueError(f"experiment {config.experiment_id!r} has no arm {arm!r}; arms: {arm_names(config)}")
    canary = config.arm(arm).canary
    if canary is None:
        raise ValueError(f"arm {arm!r} has no running canary")
    return canary


def _share(share: object) -> float:
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < share <= 1.0:
        raise ValueError(f"canary share must be in (0, 1], got {share!r}")
    return float(share)


def _target(target: object) -> float:
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0.0 < target < 1.0:
        raise ValueError(f"target false-hit rate must be in (0, 1), got {target!r}")
    return float(target)


def with_threshold(config: ExperimentConfig, arm: str, new_threshold: float,
                   actor: str, at_ms: int) -> ExperimentConfig:
    """A copy of ``config`` with ``arm``'s threshold changed and the version bumped."""
    return bumped(set_threshold(arm, new_threshold)(config), config.version + 1, actor, at_ms)


def with_multi(config: ExperimentConfig, arm: str, actor: str, at_ms: int, *,
               score_floor: float | None = None, answer_margin: float | None = None) -> ExperimentConfig:
    """A copy of ``config`` with a multi arm's score floor / answer margin changed and the version bumped."""
    change = set_multi(arm, score_floor=score_floor, answer_margin=answer_margin)
    return bumped(change(config), config.version + 1, actor, at_ms)


def changed_arms(old: ExperimentConfig, new: ExperimentConfig) -> list[str]:
    """Arms whose threshold, cluster thresholds, canary, multi settings or feedback invalidation
    differ between two configs."""
    def key(arm: ArmConfig):
        return arm.threshold, arm.cluster_thresholds, arm.canary, arm.multi, arm.invalidate_after_wrong
    before = {a.name: key(a) for a in old.arms}
    return [a.name for a in new.arms if before.get(a.name) != key(a)]


def previous_config(history: pd.DataFrame, current: ExperimentConfig,
                    fallback: ExperimentConfig | None = None) -> ExperimentConfig | None:
    """The newest recorded config older than ``current`` (``queries.change_history`` rows),
    else ``fallback`` (the experiments file) if it is older; None if there is none."""
    if not history.empty:
        older = history[history["new_version"] < current.version].sort_values("new_version")
        for config_json in reversed(older["config_json"].tolist()):
            if config_json:
                return ExperimentConfig.model_validate(json.loads(config_json))
    if fallback is not None and fallback.version < current.version:
        return fallback
    return None
