"""Control-panel logic, free of any UI: config pushes, canaries, rollback, what-if.

A push re-reads the experiment's current config right before publishing (the control
topic folded over the experiments file by ``cache_core.registry.ControlFold``, the
rule every cache instance applies), refuses if it moved past the version the caller
loaded (optimistic concurrency), applies one change (arm threshold, cluster
threshold, canary start / promote / rollback, a multi arm's score floor / answer
margin, or a restore of an earlier config's thresholds), publishes the full new
config with ``version + 1`` on the control topic, then confirms it won: it folds the
topic up to its own record, and if another push claimed that version first (two
dashboards, or a person and ``dashboard.control.autotune``, racing from the same version),
raises VersionConflict naming the winner. Only a confirmed push is recorded in
ClickHouse: one audit row per changed arm in ``threshold_changes`` and the new
definition in ``experiments``; the loser's record stays on the topic but wins
nowhere, and nothing of it is audited.
"""
from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from pydantic import ValidationError

from cache_core.decision.thresholds import multi_for
from cache_core.events import ControlMessage, now_ms
from cache_core.experiments import (ArmConfig, CanaryConfig, ExperimentConfig, MultiSimilarityConfig,
                                    load_experiments)
from cache_core.registry import Winner
from cache_core.settings import Settings
from dashboard.control.queries import TOPIC_AUDIT_NOTE
from dashboard.control.tuning import servable

log = logging.getLogger(__name__)

MAX_ACTOR_CHARS = 128
MAX_REASON_CHARS = 1000
THRESHOLD_CHANGE_COLUMNS = [
    "ts", "experiment_id", "arm", "actor", "old_threshold", "new_threshold",
    "old_version", "new_version", "reason", "canary_share", "config_json",
]
EXPERIMENT_COLUMNS = ["experiment_id", "version", "config_json", "updated_by", "updated_at"]


# Pushes from one dashboard process (every Streamlit session is a thread) are
# serialised, so the re-read + publish below cannot interleave between sessions;
# across processes the version check narrows the window to the publish itself, and
# the confirmation after it tells the loser of a race in that window.
_PUSH_LOCK = threading.Lock()

Change = Callable[[ExperimentConfig], ExperimentConfig]
"""A pure edit of a config's arms (the version bump is done by publish_change)."""


class VersionConflict(ValueError):
    """The config moved on since the caller loaded it: nothing was published, or (with
    ``lost``) the push was published but another one had claimed its version first, so
    it is in force nowhere and was not audited."""

    def __init__(self, experiment_id: str, expected: int | None, current: ExperimentConfig, *,
                 lost: ControlMessage | None = None) -> None:
        if lost is None:
            text = (f"experiment {experiment_id!r} is now at config version {current.version} "
                    f"(by {current.updated_by}), not version {expected} you loaded; reload and try again")
        elif current.version == lost.experiment.version:
            text = (f"experiment {experiment_id!r}: config version {current.version} was claimed first by "
                    f"{current.updated_by}; your push of that version lost the race, applies nowhere and "
                    "was not audited; reload and try again")
        else:
            text = (f"experiment {experiment_id!r} is at config version {current.version} (by "
                    f"{current.updated_by}), ahead of your push of version {lost.experiment.version}, which "
                    "lost the race, applies nowhere and was not audited; reload and try again")
        super().__init__(text)
        self.current = current
        self.lost = lost


class AuditWriteError(RuntimeError):
    """The change was published (and is live) but writing its audit rows failed."""

    def __init__(self, message: ControlMessage, cause: Exception) -> None:
        super().__init__(
            f"config version {message.experiment.version} of {message.experiment.experiment_id!r} "
            f"was published, but the audit write to ClickHouse failed: {cause}")
        self.control_message = message


def validate_threshold(value: object) -> float:
    """A finite number in [0, 1], or a ValueError saying what was wrong."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"threshold must be a number, got {value!r}")
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"threshold must be between 0 and 1, got {value}")
    return float(value)


def _validate_actor(actor: str, reason: str) -> tuple[str, str]:
    actor = (actor or "").strip()
    if not actor:
        raise ValueError("actor is required: say who is making the change")
    if len(actor) > MAX_ACTOR_CHARS:
        raise ValueError(f"actor must be at most {MAX_ACTOR_CHARS} characters, got {len(actor)}")
    reason = (reason or "").strip()
    if len(reason) > MAX_REASON_CHARS:
        raise ValueError(f"reason must be at most {MAX_REASON_CHARS} characters, got {len(reason)}")
    return actor, reason


def current_config(settings: Settings, experiment_id: str) -> ExperimentConfig:
    """The live config: the control topic's winner over the experiments file
    (``ControlFold``, as every cache instance decides it)."""
    return _live_winner(settings, experiment_id).config


def file_configs(settings: Settings) -> dict[str, ExperimentConfig]:
    """The experiments file's configs ({} and a warning when it is missing or invalid)."""
    try:
        return load_experiments(settings.experiments_file)
    except ValueError as exc:  # no usable file: the topic alone may still know the experiment
        log.warning("experiments file not usable, reading the control topic alone", extra={"error": str(exc)})
        return {}


def live_state(settings: Settings, experiment_id: str) -> tuple[ExperimentConfig, list[ControlMessage]]:
    """The live config (``current_config``) and the versions that were in force
    (``config_history``), from one read of the control topic."""
    fold = _read_fold(settings)
    return _winner_in(fold, experiment_id).config, fold.history(experiment_id)


def _read_fold(settings: Settings, base: dict[str, ExperimentConfig] | None = None):
    # Imported here so the what-if helpers load without a Kafka client.
    from cache_core.control import read_control
    return read_control(settings.kafka, base=file_configs(settings) if base is None else base)


def _winner_in(fold, experiment_id: str) -> Winner:
    winner = fold.winner(experiment_id)
    if winner is None:
        raise ValueError(f"unknown experiment {experiment_id!r}; known experiments: {sorted(fold.winners())}")
    return winner


def _live_winner(settings: Settings, experiment_id: str) -> Winner:
    return _winner_in(_read_fold(settings), experiment_id)


def _replace_arm(config: ExperimentConfig, arm: str, **fields) -> ExperimentConfig:
    names = [a.name for a in config.arms]
    if arm not in names:
        raise ValueError(f"experiment {config.experiment_id!r} has no arm {arm!r}; arms: {names}")
    data = config.model_dump()
    for arm_data in data["arms"]:
        if arm_data["name"] == arm:
            arm_data.update(fields)
    return ExperimentConfig.model_validate(data)


def _bumped(config: ExperimentConfig, version: int, actor: str, at_ms: int) -> ExperimentConfig:
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
        clusters = dict(config.arm(arm).cluster_thresholds) if arm in _names(config) else {}
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
    """The canary's threshold (and score floor / answer margin) become the arm's; the canary ends."""
    def change(config: ExperimentConfig) -> ExperimentConfig:
        canary = _running_canary(config, arm)
        multi = {"multi": multi_for(config.arm(arm), "canary").model_dump()} if canary.multi_override else {}
        return _replace_arm(config, arm, threshold=canary.threshold, canary=None, **multi)
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
            if arm.name in _names(previous):
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
        if arm not in _names(config):
            raise ValueError(f"experiment {config.experiment_id!r} has no arm {arm!r}; arms: {_names(config)}")
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
        if arm not in _names(config):
            raise ValueError(f"experiment {config.experiment_id!r} has no arm {arm!r}; arms: {_names(config)}")
        if config.arm(arm).invalidate_after_wrong == users:
            raise ValueError(f"arm {arm!r} already removes entries after {users} users' wrong verdicts; "
                             "nothing to push")
        return _replace_arm(config, arm, invalidate_after_wrong=users)
    return change


def _names(config: ExperimentConfig) -> list[str]:
    return [a.name for a in config.arms]


def _running_canary(config: ExperimentConfig, arm: str) -> CanaryConfig:
    if arm not in _names(config):
        raise ValueError(f"experiment {config.experiment_id!r} has no arm {arm!r}; arms: {_names(config)}")
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
    return _bumped(set_threshold(arm, new_threshold)(config), config.version + 1, actor, at_ms)


def with_multi(config: ExperimentConfig, arm: str, actor: str, at_ms: int, *,
               score_floor: float | None = None, answer_margin: float | None = None) -> ExperimentConfig:
    """A copy of ``config`` with a multi arm's score floor / answer margin changed and the version bumped."""
    change = set_multi(arm, score_floor=score_floor, answer_margin=answer_margin)
    return _bumped(change(config), config.version + 1, actor, at_ms)


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


def audit_rows(message: ControlMessage, arm: str, old_threshold: float | None,
               old_version: int) -> tuple[list, list]:
    """(threshold_changes row, experiments row) for a published change of ``arm``.

    A running canary is recorded as the threshold being tried (new_threshold) and
    its share (canary_share), so the time series marks when the canary started.
    """
    config = message.experiment
    at = datetime.fromtimestamp(message.ts_ms / 1000, tz=timezone.utc)
    config_json = config.model_dump_json()
    arm_config = config.arm(arm)
    canary = arm_config.canary
    new_threshold = canary.threshold if canary is not None else arm_config.threshold
    change = [at, config.experiment_id, arm, message.actor, old_threshold,
              new_threshold, old_version, config.version, message.reason,
              canary.share if canary is not None else None, config_json]
    definition = [config.experiment_id, config.version, config_json, message.actor, at]
    return change, definition


def record_change(client, message: ControlMessage, arm: str | Sequence[str], old_threshold: float | None | dict,
                  old_version: int) -> None:
    """Write one audit row per changed arm and the new experiment definition to ClickHouse.

    ``arm`` may be a list of arms, with ``old_threshold`` then a dict arm -> old threshold.
    """
    arms = [arm] if isinstance(arm, str) else list(arm)
    olds = old_threshold if isinstance(old_threshold, dict) else {arms[0]: old_threshold}
    rows = [audit_rows(message, a, olds.get(a), old_version) for a in arms]
    if rows:
        client.insert("threshold_changes", [r[0] for r in rows], column_names=THRESHOLD_CHANGE_COLUMNS)
    _, definition = audit_rows(message, message.experiment.arms[0].name, None, old_version)
    client.insert("experiments", [definition], column_names=EXPERIMENT_COLUMNS)




def config_history(settings: Settings, experiment_id: str,
                   base: dict[str, ExperimentConfig] | None = None) -> list[ControlMessage]:
    """Every control message that put a version of the experiment in force, oldest first
    (``ControlFold.history`` over the experiments file, or ``base``)."""
    return _read_fold(settings, base).history(experiment_id)


def sync_audit(settings: Settings, experiment_id: str, client,
               history: list[ControlMessage] | None = None) -> list[int]:
    """Audit the versions in force that have no audit rows yet, from the control topic.

    Pushes through the cache's admin API (``PUT /v1/admin/experiments``) reach the topic
    but not ClickHouse, and a push whose audit write failed (AuditWriteError) is live all
    the same. Without their rows the change history has gaps, and auto-tune cannot tell
    which score floor a multi arm's decisions were logged at. Each missing version gets
    rows for the arms it changed against the version before it (every arm when only other
    settings changed), with the message's actor, time and reason (marked
    ``TOPIC_AUDIT_NOTE``). ``history``: ``config_history`` if already read. Returns the
    versions written; raises ControlError when the topic cannot be read."""
    from dashboard.control.queries import audited_versions

    base = file_configs(settings)
    if history is None:
        history = config_history(settings, experiment_id, base)
    audited = audited_versions(client, experiment_id)
    previous, written = base.get(experiment_id), []
    for message in history:
        config = message.experiment
        if config.version not in audited:
            before = {a.name: a for a in previous.arms} if previous is not None else {}
            arms = (changed_arms(previous, config) if previous is not None else []) or \
                [a.name for a in config.arms if before.get(a.name) != a] or _names(config)
            noted = message.model_copy(update={"reason": f"{message.reason} {TOPIC_AUDIT_NOTE}".strip()})
            record_change(client, noted, arms, {a: before[a].threshold if a in before else None for a in arms},
                          previous.version if previous is not None else 0)
            written.append(config.version)
        previous = config
    if written:
        log.info("audited config versions from the control topic",
                 extra={"experiment_id": experiment_id, "versions": written})
    return written


def publish_change(settings: Settings, experiment_id: str, change: Change, actor: str, reason: str,
                   *, expected_version: int | None, client=None,
                   clock: Callable[[], int] = now_ms) -> ControlMessage:
    """Apply ``change`` to the live config and publish it as the next version, then audit it.

    ``expected_version`` is the version the caller based the change on; if the
    control topic has moved past it, VersionConflict is raised and nothing is
    published (None skips this check, for scripts that want last-writer-wins).
    Either way the published push must then win its version (see the module
    docstring): if a concurrent push claimed it first, VersionConflict (``lost`` set)
    is raised and nothing is audited. Raises ValueError for bad input before anything
    is published, ControlError if the push went out but could not be confirmed (then
    nothing is audited either; reload to see what is in force), and AuditWriteError
    if the change won but ClickHouse did not take the audit rows.
    """
    from cache_core.chclient import connect
    from cache_core.control import ControlError, ControlLost, ControlUnconfirmed, publish_confirmed

    actor, reason = _validate_actor(actor, reason)
    with _PUSH_LOCK:
        current = current_config(settings, experiment_id)  # re-read right before publishing
        if expected_version is not None and current.version != expected_version:
            raise VersionConflict(experiment_id, expected_version, current)
        at_ms = clock()
        updated = _bumped(change(current), current.version + 1, actor, at_ms)
        arms = changed_arms(current, updated)
        if not arms:
            raise ValueError("the change leaves every arm as it is; nothing to push")
        message = ControlMessage(experiment=updated, actor=actor, reason=reason, ts_ms=at_ms)
        # Another process may have published the same version between our read and our
        # send: publish_confirmed folds the topic up to our own record to say which came first.
        try:
            published = publish_confirmed(settings.kafka, message, base=file_configs(settings))
        except ControlLost as exc:
            winner = exc.winner or current
            log.warning("config push lost to a concurrent push", extra={
                "experiment_id": experiment_id, "version": updated.version, "actor": actor,
                "winner_version": winner.version, "winner_actor": winner.updated_by})
            raise VersionConflict(experiment_id, expected_version, winner, lost=message) from exc
        except ControlUnconfirmed as exc:
            raise ControlError(f"{exc}; nothing was audited, reload to see the config in force") from exc
    log.info("config pushed", extra={"experiment_id": experiment_id, "arms": arms,
                                     "version": updated.version, "actor": actor, "offset": published.offset})
    try:
        record_change(client if client is not None else connect(settings.clickhouse), message, arms,
                      {a: current.arm(a).threshold for a in arms}, current.version)
    except Exception as exc:  # the change is live either way; say so precisely
        log.error("audit write failed", extra={"experiment_id": experiment_id, "error": str(exc)})
        raise AuditWriteError(message, exc) from exc
    return message


def push_threshold(settings: Settings, experiment_id: str, arm: str, new_threshold: float,
                   actor: str, reason: str, *, client=None, expected_version: int | None = None,
                   clock: Callable[[], int] = now_ms) -> ControlMessage:
    """Publish ``arm``'s new threshold as the next config version and audit it (see publish_change)."""
    return publish_change(settings, experiment_id, set_threshold(arm, new_threshold), actor, reason,
                          expected_version=expected_version, client=client, clock=clock)


def push_multi(settings: Settings, experiment_id: str, arm: str, actor: str, reason: str, *,
               score_floor: float | None = None, answer_margin: float | None = None, client=None,
               expected_version: int | None = None, clock: Callable[[], int] = now_ms) -> ControlMessage:
    """Publish a multi arm's new score floor / answer margin as the next config version and audit it
    (see publish_change; the audit row's thresholds are the arm's unchanged cosine threshold,
    its config_json carries the new multi settings)."""
    return publish_change(settings, experiment_id, set_multi(arm, score_floor=score_floor, answer_margin=answer_margin),
                          actor, reason, expected_version=expected_version, client=client, clock=clock)


# -- what-if ---------------------------------------------------------------------------

def _min_bin(threshold: float, bin_width: float) -> int:
    """First similarity bin whose every value is >= threshold (bins are [k*w, (k+1)*w))."""
    return math.ceil(threshold / bin_width - 1e-9)


def whatif_hit_rate(similarity_hist: pd.DataFrame, threshold: float,
                    bin_width: float = 0.001) -> pd.DataFrame:
    """Estimated hit rate per arm had ``threshold`` applied to the logged decisions.

    ``similarity_hist`` is ``queries.similarity_histogram``: per arm and
    ``similarity_milli`` bin, decisions / hits / guard_blocks. A decision counts as
    an estimated hit when its top-1 similarity reaches the threshold and no guard
    blocked it (nor, for a multi arm, its current score floor / answer margin:
    ``multi_blocks``; see dashboard.control.tuning for where that replay holds). First-order
    estimate: it holds the cache's contents fixed, while a different threshold would
    also change what got stored and evicted.
    """
    threshold = validate_threshold(threshold)
    columns = ["arm", "decisions", "observed_hits", "observed_hit_rate", "est_hits", "est_hit_rate"]
    if similarity_hist.empty:
        return pd.DataFrame(columns=columns)
    df = similarity_hist
    passes = df["similarity_milli"].notna() & (df["similarity_milli"].fillna(-10**9) >= _min_bin(threshold, bin_width))
    est = servable(df).where(passes, 0)
    out = pd.DataFrame({"arm": df["arm"], "decisions": df["decisions"], "observed_hits": df["hits"],
                        "est_hits": est}).groupby("arm", as_index=False).sum()
    out["observed_hit_rate"] = out["observed_hits"] / out["decisions"]
    out["est_hit_rate"] = out["est_hits"] / out["decisions"]
    return out[columns]


def whatif_curve(similarity_hist: pd.DataFrame,
                 thresholds: Sequence[float] | None = None) -> pd.DataFrame:
    """``whatif_hit_rate`` over a grid of thresholds: columns arm, threshold, est_hit_rate."""
    grid = thresholds if thresholds is not None else np.round(np.arange(0.50, 1.0001, 0.01), 2)
    frames = [whatif_hit_rate(similarity_hist, float(t)).assign(threshold=float(t)) for t in grid]
    if not frames or all(f.empty for f in frames):
        return pd.DataFrame(columns=["arm", "threshold", "est_hit_rate"])
    return pd.concat(frames, ignore_index=True)[["arm", "threshold", "est_hit_rate"]]
