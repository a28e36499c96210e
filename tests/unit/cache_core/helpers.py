"""Small in-process helpers for decision-logic tests: a text->vector table standing in
for the model where exact similarities are needed, a recording event sink, a clock."""
from __future__ import annotations

import numpy as np

from cache_core.embedding.embedder import normalise
from cache_core.events import CacheEvent
from cache_core.experiments import ArmConfig, ExperimentConfig


class TableEmbedder:
    """Encodes known texts to given vectors (normalised); unknown texts get a fresh
    random direction, so they are dissimilar to everything."""

    def __init__(self, table: dict[str, np.ndarray], dim: int | None = None, seed: int = 0):
        self.dim = dim or len(next(iter(table.values())))
        self.table = {k: np.asarray(v, dtype=np.float32) for k, v in table.items()}
        self._rng = np.random.default_rng(seed)

    def encode_with_norms(self, texts):
        rows = []
        for text in texts:
            if text not in self.table:
                self.table[text] = self._rng.standard_normal(self.dim).astype(np.float32)
            rows.append(self.table[text])
        return normalise(np.vstack(rows))

    def encode(self, texts):
        return self.encode_with_norms(texts)[0]


class RecordingSink:
    def __init__(self):
        self.events: list[CacheEvent] = []

    def __call__(self, event: CacheEvent) -> None:
        self.events.append(event)


class ManualClock:
    def __init__(self, start: float = 1_700_000_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def unit_vec(*components: float, dim: int = 8) -> np.ndarray:
    vec = np.zeros(dim, dtype=np.float32)
    vec[: len(components)] = components
    return vec


def at_cosine(cos: float, dim: int = 8) -> np.ndarray:
    """A unit vector whose cosine with e0 is ``cos``."""
    return unit_vec(cos, float(np.sqrt(max(0.0, 1 - cos * cos))), dim=dim)


def experiment(*arms: ArmConfig, mode: str = "partitioned", traffic_share: float = 1.0,
               version: int = 1, experiment_id: str = "exp") -> ExperimentConfig:
    return ExperimentConfig(experiment_id=experiment_id, salt="salt", traffic_share=traffic_share,
                            partition_mode=mode, arms=list(arms), version=version)


def unit_in_arm(exp: ExperimentConfig, arm: str, prefix: str = "u") -> str:
    from cache_core.experiments import assign
    for i in range(10_000):
        if assign(exp, f"{prefix}{i}").arm == arm:
            return f"{prefix}{i}"
    raise AssertionError(f"no unit lands in {arm}")


class RecordingPublisher:
    """In-process stand-in with EventPublisher's interface, for unit tests of the app."""

    def __init__(self):
        self.events: list[CacheEvent] = []
        self.feedback = []
        self.entries = []

    def publish_event(self, event: CacheEvent) -> None:
        self.events.append(event)

    def publish_feedback(self, feedback) -> None:
        self.feedback.append(feedback)

    def publish_entry(self, message) -> None:
        self.entries.append(message)

    def stats(self) -> dict:
        return {"queue_depth": 0, "published": len(self.events) + len(self.feedback),
                "spooled": 0, "replayed": 0, "dropped": 0}

    def close(self) -> None:
        pass
