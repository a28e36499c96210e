"""Control-panel logic, free of any UI: threshold pushes and what-if estimates.

A push reads the experiment's current config (the latest version on the compacted
control topic, else the experiments file), validates the change, publishes the full
new config with ``version + 1`` on the control topic (the cache applies it), and
records it in ClickHouse: an audit row in ``threshold_changes`` and the new
definition in ``experiments``.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from cache_core.events import ControlMessage, now_ms
from cache_core.experiments import ExperimentConfig, load_experiments
from cache_core.settings import Settings

log = logging.getLogger(__name__)

MAX_ACTOR_CHARS = 128
MAX_REASON_CHARS = 1000
THRESHOLD_CHANGE_COLUMNS = [
    "ts", "experiment_id", "arm", "actor", "old_threshold", "new_threshold",
    "old_version", "new_version", "reason", "canary_share", "config_json",
]
EXPERIMENT_COLUMNS = ["experiment_id", "version", "config_json", "updated_by", "updated_at"]


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
    """The live config: latest on the control topic, else the experiments file."""
    # Imported here so the what-if helpers load without a Kafka client.
    from cache_core.control import read_latest_configs
    latest = read_latest_configs(settings.kafka)
    if experiment_id in latest:
        return latest[experiment_id].experiment
    from_file = load_experiments(settings.experiments_file)
    if experiment_id in from_file:
        return from_file[experiment_id]
    known = sorted(set(latest) | set(from_file))
    raise ValueError(f"unknown experiment {experiment_id!r}; known experiments: {known}")


def with_threshold(config: ExperimentConfig, arm: str, new_threshold: float,
                   actor: str, at_ms: int) -> ExperimentConfig:
    """A copy of ``config`` with ``arm``'s threshold changed and the version bumped."""
    threshold = validate_threshold(new_threshold)
    names = [a.name for a in config.arms]
    if arm not in names:
        raise ValueError(f"experiment {config.experiment_id!r} has no arm {arm!r}; arms: {names}")
    data = config.model_dump()
    for arm_data in data["arms"]:
        if arm_data["name"] == arm:
            arm_data["threshold"] = threshold
    data.update(version=config.version + 1, updated_by=actor, updated_at_ms=at_ms)
    return ExperimentConfig.model_validate(data)


def audit_rows(message: ControlMessage, arm: str, old_threshold: float | None,
               old_version: int) -> tuple[list, list]:
    """(threshold_changes row, experiments row) for a published change."""
    config = message.experiment
    at = datetime.fromtimestamp(message.ts_ms / 1000, tz=timezone.utc)
    config_json = config.model_dump_json()
    change = [at, config.experiment_id, arm, message.actor, old_threshold,
              config.arm(arm).threshold, old_version, config.version, message.reason,
              None, config_json]
    definition = [config.experiment_id, config.version, config_json, message.actor, at]
    return change, definition


def record_change(client, message: ControlMessage, arm: str, old_threshold: float | None,
                  old_version: int) -> None:
    """Write the audit row and the new experiment definition to ClickHouse."""
    change, definition = audit_rows(message, arm, old_threshold, old_version)
    client.insert("threshold_changes", [change], column_names=THRESHOLD_CHANGE_COLUMNS)
    client.insert("experiments", [definition], column_names=EXPERIMENT_COLUMNS)


def push_threshold(settings: Settings, experiment_id: str, arm: str, new_threshold: float,
                   actor: str, reason: str, *, client=None,
                   clock: Callable[[], int] = now_ms) -> ControlMessage:
    """Publish ``arm``'s new threshold as the next config version and audit it.

    Raises ValueError for bad input (threshold outside [0, 1], unknown experiment
    or arm, missing actor) before anything is published, and AuditWriteError if
    the change went out but ClickHouse did not take the audit rows.
    """
    from cache_core.chclient import connect
    from cache_core.control import publish_control

    validate_threshold(new_threshold)
    actor, reason = _validate_actor(actor, reason)
    current = current_config(settings, experiment_id)
    at_ms = clock()
    updated = with_threshold(current, arm, new_threshold, actor, at_ms)
    message = ControlMessage(experiment=updated, actor=actor, reason=reason, ts_ms=at_ms)
    publish_control(settings.kafka, message)
    log.info("threshold pushed", extra={"experiment_id": experiment_id, "arm": arm,
                                        "threshold": float(new_threshold), "version": updated.version,
                                        "actor": actor})
    try:
        record_change(client if client is not None else connect(settings.clickhouse),
                      message, arm, current.arm(arm).threshold, current.version)
    except Exception as exc:  # the change is live either way; say so precisely
        log.error("audit write failed", extra={"experiment_id": experiment_id, "error": str(exc)})
        raise AuditWriteError(message, exc) from exc
    return message


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
    blocked it. First-order estimate: it holds the cache's contents fixed, while a
    different threshold would also change what got stored and evicted.
    """
    threshold = validate_threshold(threshold)
    columns = ["arm", "decisions", "observed_hits", "observed_hit_rate", "est_hits", "est_hit_rate"]
    if similarity_hist.empty:
        return pd.DataFrame(columns=columns)
    df = similarity_hist
    passes = df["similarity_milli"].notna() & (df["similarity_milli"].fillna(-10**9) >= _min_bin(threshold, bin_width))
    est = (df["decisions"] - df["guard_blocks"]).where(passes, 0)
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
