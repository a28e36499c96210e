"""The experiment configs in force, replaced only by a higher version (thread-safe)."""
from __future__ import annotations

import logging
import threading
from pathlib import Path

from cache_core.events import ControlMessage
from cache_core.experiments import ExperimentConfig, load_experiments

log = logging.getLogger(__name__)


class UnknownExperiment(KeyError):
    """The request names an experiment the cache does not serve."""

    def __init__(self, experiment_id: str | None):
        super().__init__(experiment_id)
        self.experiment_id = experiment_id

    def __str__(self) -> str:
        if self.experiment_id is None:
            return "no experiment is configured"
        return f"unknown experiment {self.experiment_id!r}"


class ExperimentRegistry:
    """Experiment id -> config. The first experiment (file order) is the default for
    requests that name none. Reads return immutable snapshots, so one request sees one
    version from start to end even if a control message lands meanwhile."""

    def __init__(self, experiments: dict[str, ExperimentConfig]):
        self._lock = threading.Lock()
        self._by_id = dict(experiments)
        self._default = next(iter(experiments), None)

    @classmethod
    def from_file(cls, path: Path) -> "ExperimentRegistry":
        return cls(load_experiments(path))

    def get(self, experiment_id: str | None = None) -> ExperimentConfig:
        """The config for ``experiment_id`` (the default one if None)."""
        with self._lock:
            key = self._default if experiment_id is None else experiment_id
            if key is None or key not in self._by_id:
                raise UnknownExperiment(experiment_id)
            return self._by_id[key]

    def all(self) -> list[ExperimentConfig]:
        with self._lock:
            return list(self._by_id.values())

    def apply(self, message: ControlMessage) -> bool:
        """Install the message's config if its version is higher than the one in force
        (or the experiment is new). Returns whether it was applied."""
        config = message.experiment
        with self._lock:
            current = self._by_id.get(config.experiment_id)
            if current is not None and config.version <= current.version:
                log.info("control message ignored: version not higher", extra={
                    "experiment_id": config.experiment_id, "version": config.version,
                    "in_force": current.version})
                return False
            self._by_id[config.experiment_id] = config
            if self._default is None:
                self._default = config.experiment_id
        log.info("experiment config applied", extra={
            "experiment_id": config.experiment_id, "version": config.version,
            "actor": message.actor, "reason": message.reason})
        return True
