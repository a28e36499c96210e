"""Intent clusters, the experiment registry's versioning, and sticky assignment."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from scipy import stats

from cache_core.clusters import OnlineClusters
from cache_core.events import ControlMessage
from cache_core.experiments import ArmConfig, ExperimentConfig, assign
from cache_core.registry import ExperimentRegistry, UnknownExperiment
from tests.unit.cache_core.helpers import experiment


def test_clusters_open_beyond_radius_and_ids_are_stable():
    clusters = OnlineClusters(dim=3, radius=0.8)
    a, b = np.array([1, 0, 0], np.float32), np.array([0, 1, 0], np.float32)
    near_a = np.array([0.95, 0.31, 0], np.float32)
    assert clusters.assign(a) == 0 and clusters.assign(b) == 1
    assert clusters.assign(near_a) == 0 and clusters.assign(a) == 0 and len(clusters) == 2
    assert clusters.nearest(b) == (1, pytest.approx(1.0))


def test_clusters_stop_growing_at_max():
    clusters = OnlineClusters(dim=2, radius=0.99, max_clusters=2)
    for angle in np.linspace(0, np.pi, 10):
        clusters.assign(np.array([np.cos(angle), np.sin(angle)], np.float32))
    assert len(clusters) == 2


def registry_with(version=3):
    exp = experiment(ArmConfig(name="a", threshold=0.8), version=version)
    return ExperimentRegistry({exp.experiment_id: exp}), exp


def test_registry_applies_only_higher_versions():
    registry, exp = registry_with(version=3)
    lower = exp.model_copy(update={"version": 2, "arms": [ArmConfig(name="a", threshold=0.1)]})
    same = exp.model_copy(update={"arms": [ArmConfig(name="a", threshold=0.2)]})
    higher = exp.model_copy(update={"version": 4, "arms": [ArmConfig(name="a", threshold=0.7)]})
    assert not registry.apply(ControlMessage(experiment=lower))
    assert not registry.apply(ControlMessage(experiment=same))
    assert registry.get("exp").arms[0].threshold == 0.8
    assert registry.apply(ControlMessage(experiment=higher))
    assert registry.get().version == 4 and registry.get("exp").arms[0].threshold == 0.7


def test_registry_adds_new_experiments_and_rejects_unknown():
    registry, _ = registry_with()
    other = experiment(ArmConfig(name="x"), experiment_id="other")
    assert registry.apply(ControlMessage(experiment=other))
    assert {e.experiment_id for e in registry.all()} == {"exp", "other"}
    assert registry.get().experiment_id == "exp"  # default stays the file's first
    with pytest.raises(UnknownExperiment):
        registry.get("missing")
    with pytest.raises(UnknownExperiment, match="no experiment"):
        ExperimentRegistry({}).get()


def test_registry_concurrent_applies_keep_the_highest():
    registry, exp = registry_with(version=1)
    versions = list(range(2, 202))
    np.random.default_rng(0).shuffle(versions)
    threads = [threading.Thread(target=registry.apply, args=(
        ControlMessage(experiment=exp.model_copy(update={"version": v})),)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert registry.get("exp").version == 201


def three_arms(share: float = 1.0) -> ExperimentConfig:
    return ExperimentConfig(experiment_id="split", salt="s1", traffic_share=share, arms=[
        ArmConfig(name="a", weight=1), ArmConfig(name="b", weight=1), ArmConfig(name="c", weight=2)])


def test_assignment_is_sticky_and_salted():
    exp = three_arms()
    arms = [assign(exp, f"user-{i}").arm for i in range(500)]
    assert arms == [assign(exp, f"user-{i}").arm for i in range(500)]
    resalted = exp.model_copy(update={"salt": "s2"})
    assert arms != [assign(resalted, f"user-{i}").arm for i in range(500)]


def test_assignment_split_matches_weights():
    exp, n = three_arms(), 20_000
    counts = {"a": 0, "b": 0, "c": 0}
    for i in range(n):
        counts[assign(exp, f"u{i}").arm] += 1
    observed = [counts["a"], counts["b"], counts["c"]]
    assert stats.chisquare(observed, [n / 4, n / 4, n / 2]).pvalue > 0.001


def test_holdout_share_and_probabilities():
    exp, n = three_arms(share=0.8), 20_000
    results = [assign(exp, f"u{i}") for i in range(n)]
    holdout = sum(r.is_holdout for r in results)
    assert stats.binomtest(holdout, n, 0.2).pvalue > 0.001
    assert all(r.probability == pytest.approx(0.4) for r in results if r.arm == "c")
    assert all(r.probability == pytest.approx(0.2) for r in results if r.is_holdout)
