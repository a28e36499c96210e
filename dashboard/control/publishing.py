"""Publishing config changes, free of any UI: push, confirm, audit.

A push re-reads the experiment's current config right before publishing (the control
topic folded over the experiments file by ``cache_core.registry.ControlFold``, the
rule every cache instance applies), refuses if it moved past the version the caller
loaded (optimistic concurrency), applies one change (a ``changes.Change``: arm
threshold, cluster threshold, canary start / promote / rollback, a multi arm's score
floor / answer margin, or a restore of an earlier config's thresholds), publishes the full new
config with ``version + 1`` on the control topic, then confirms it won: it folds the
topic up to its own record, and if another push claimed that version first (two
dashboards, or a person and ``dashboard.control.autotune``, racing from the same version),
raises VersionConflict naming the winner. Only a confirmed push is recorded in
ClickHouse: one audit row per changed arm in ``threshold_changes`` and the new
definition in ``experiments``; the loser's record stays on the topic but wins
nowhere, and nothing of it is audited.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from cache_core.events import ControlMessage, now_ms
from cache_core.experiments import ExperimentConfig, load_experiments
from cache_core.registry import Winner
from cache_core.settings import Settings
from dashboard.control.changes import Change, arm_names, bumped, changed_arms, set_multi, set_threshold
from dashboard.control.sql import TOPIC_AUDIT_NOTE

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
    from cache_core.publish.control_topic import read_control
    return read_control(settings.kafka, base=file_configs(settings) if base is None else base)


def _winner_in(fold, experiment_id: str) -> Winner:
    winner = fold.winner(experiment_id)
    if winner is None:
        raise ValueError(f"unknown experiment {experiment_id!r}; known experiments: {sorted(fold.winners())}")
    return winner


def _live_winner(settings: Settings, experiment_id: str) -> Winner:
    return _winner_in(_read_fold(settings), experiment_id)


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
                [a.name for a in config.arms if before.get(a.name) != a] or arm_names(config)
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
    from cache_core.publish.control_topic import ControlError, ControlLost, ControlUnconfirmed, publish_confirmed

    actor, reason = _validate_actor(actor, reason)
    with _PUSH_LOCK:
        current = current_config(settings, experiment_id)  # re-read right before publishing
        if expected_version is not None and current.version != expected_version:
            raise VersionConflict(experiment_id, expected_version, current)
        at_ms = clock()
        updated = bumped(change(current), current.version + 1, actor, at_ms)
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





