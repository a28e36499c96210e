"""The experiment configs in force, and the one rule deciding which control message wins.

``ControlFold`` is that rule, pure (no Kafka): the cache's registry (live and at
startup replay) and the dashboard's live-config read and push confirmation all fold
the control topic through it, so they agree on the winner of every experiment.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cache_core.events import ControlMessage
from cache_core.experiments import ExperimentConfig, load_experiments

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControlRecord:
    """One control-topic record as the fold sees it, in partition order."""

    key: bytes | None
    message: ControlMessage | None
    """None for a tombstone (or an unreadable value): the record only removes the
    earlier record with its key, as compaction would."""
    offset: int = -1


@dataclass(frozen=True)
class Winner:
    """The config in force for one experiment and where it came from."""

    config: ExperimentConfig
    message: ControlMessage | None = None
    """None: the base config (the experiments file), not a control message."""
    key: bytes | None = None
    """The winning record's Kafka key (None for the base or a message applied locally)."""


class ControlFold:
    """Which control messages win.

    In partition order, a message wins iff its version is higher than the winner so
    far for its experiment; the base config (experiments file) counts as the first
    record, so equal versions keep the earlier one. Every record first removes the
    earlier record with the same key, exactly as compaction does; a tombstone (or
    unreadable value) does only that, and if it removed the winner, the winner is
    re-decided among the experiment's remaining records (or the base, or none).

    The result therefore depends only on the records compaction keeps, in their
    order: a reader sees the same winners before and after the cleaner runs.
    (With one record per key, see infra/kafka/topics.py, compaction keeps them all.)
    """

    def __init__(self, base: Mapping[str, ExperimentConfig] | None = None):
        self._base = dict(base or {})
        self._records: dict[str, list[tuple[bytes | None, ControlMessage]]] = {}
        self._owner: dict[bytes, str] = {}  # key -> experiment of its surviving record
        self._winners: dict[str, Winner] = {i: Winner(c) for i, c in self._base.items()}

    def offer(self, key: bytes | None, message: ControlMessage | None) -> set[str]:
        """Fold one record in; returns the experiments whose winner changed."""
        changed: set[str] = set()
        if key is not None and key in self._owner:
            experiment_id = self._owner.pop(key)
            records = self._records[experiment_id]
            records[:] = [r for r in records if r[0] != key]
            winner = self._winners.get(experiment_id)
            if winner is not None and winner.key == key:
                self._redecide(experiment_id)
                changed.add(experiment_id)
        if message is not None:
            experiment_id = message.experiment.experiment_id
            self._records.setdefault(experiment_id, []).append((key, message))
            if key is not None:
                self._owner[key] = experiment_id
            current = self._winners.get(experiment_id)
            if current is None or message.experiment.version > current.config.version:
                self._winners[experiment_id] = Winner(message.experiment, message, key)
                changed.add(experiment_id)
        return changed

    def _redecide(self, experiment_id: str) -> None:
        best = Winner(self._base[experiment_id]) if experiment_id in self._base else None
        for key, message in self._records.get(experiment_id, []):
            if best is None or message.experiment.version > best.config.version:
                best = Winner(message.experiment, message, key)
        if best is None:
            self._winners.pop(experiment_id, None)
        else:
            self._winners[experiment_id] = best

    def winner(self, experiment_id: str) -> Winner | None:
        return self._winners.get(experiment_id)

    def history(self, experiment_id: str) -> list[ControlMessage]:
        """The experiment's surviving messages that won when folded in, in topic order: each
        version that was in force, once (a racing loser, or a version at or under the base's,
        is left out). What an audit of the topic would list."""
        base = self._base.get(experiment_id)
        best = base.version if base is not None else None
        won = []
        for _, message in self._records.get(experiment_id, []):
            if best is None or message.experiment.version > best:
                won.append(message)
                best = message.experiment.version
        return won

    def winners(self) -> dict[str, Winner]:
        return dict(self._winners)

    @property
    def base(self) -> dict[str, ExperimentConfig]:
        """The configs folded over (the experiments file)."""
        return dict(self._base)

    def messages(self) -> dict[str, ControlMessage]:
        """Experiment id -> winning control message (experiments won by the base left out)."""
        return {i: w.message for i, w in self._winners.items() if w.message is not None}


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
    version from start to end even if a control message lands meanwhile.

    Control-topic records (``apply_record``, from the ControlListener) go through the
    ControlFold over the file's configs. A message applied directly (``apply``: the
    admin API right after publishing it, or tests) takes effect at once if it beats
    the fold's winner, but only provisionally: it gives way as soon as the topic
    delivers a record the fold ranks at least as high (its own copy included), so an
    instance never keeps a config the topic's order made lose.
    """

    def __init__(self, experiments: dict[str, ExperimentConfig]):
        self._lock = threading.Lock()
        self._fold = ControlFold(experiments)
        self._local: dict[str, ControlMessage] = {}
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

    def base(self) -> dict[str, ExperimentConfig]:
        """The configs the control topic is folded over (the experiments file's)."""
        return self._fold.base

    def all(self) -> list[ExperimentConfig]:
        with self._lock:
            return list(self._by_id.values())

    def apply(self, message: ControlMessage) -> bool:
        """Install the message's config (provisionally, see the class) if its version is
        higher than the one in force (or the experiment is new). Returns whether it was."""
        config = message.experiment
        with self._lock:
            current = self._by_id.get(config.experiment_id)
            if current is not None and config.version <= current.version:
                log.info("control message ignored: version not higher", extra={
                    "experiment_id": config.experiment_id, "version": config.version,
                    "in_force": current.version})
                return False
            self._local[config.experiment_id] = message
            self._install(config.experiment_id)
        log.info("experiment config applied", extra={
            "experiment_id": config.experiment_id, "version": config.version,
            "actor": message.actor, "reason": message.reason})
        return True

    def apply_record(self, record: ControlRecord) -> bool:
        """Fold one control-topic record in (partition order). Returns whether the config
        in force changed for any experiment."""
        with self._lock:
            before = dict(self._by_id)
            touched = self._fold.offer(record.key, record.message)
            if record.message is not None:
                touched.add(record.message.experiment.experiment_id)
            for experiment_id in touched:
                self._install(experiment_id)
            changed = {i for i in touched if self._by_id.get(i) != before.get(i)}
        for experiment_id in sorted(changed):
            config = self._by_id.get(experiment_id)
            if config is None:
                log.info("experiment removed by the control topic", extra={
                    "experiment_id": experiment_id, "offset": record.offset})
            else:
                log.info("experiment config applied", extra={
                    "experiment_id": experiment_id, "version": config.version, "offset": record.offset,
                    "actor": record.message.actor if record.message is not None else None})
        if not changed and record.message is not None:
            in_force = self._by_id.get(record.message.experiment.experiment_id)
            log.info("control message ignored: not the winner", extra={
                "experiment_id": record.message.experiment.experiment_id,
                "version": record.message.experiment.version, "offset": record.offset,
                "in_force": in_force.version if in_force is not None else None})
        return bool(changed)

    def _install(self, experiment_id: str) -> None:
        """Recompute the snapshot for one experiment: the fold's winner, unless a local
        message is strictly higher (then that one, else the local message is dropped)."""
        winner = self._fold.winner(experiment_id)
        local = self._local.get(experiment_id)
        if local is not None and winner is not None and local.experiment.version <= winner.config.version:
            del self._local[experiment_id]
            local = None
        config = local.experiment if local is not None else winner.config if winner is not None else None
        if config is None:
            self._by_id.pop(experiment_id, None)
            if self._default == experiment_id:
                self._default = next(iter(self._by_id), None)
        elif self._by_id.get(experiment_id) != config:  # equal content: keep the snapshot
            self._by_id[experiment_id] = config
            if self._default is None:
                self._default = experiment_id
