"""Intent-cluster retrains: ids survive a retrain, state round-trips, purity on banking77."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.special import comb

from cache_core.clusters import OnlineClusters
from infra.runtime import BANKING77_DIR

BANKING77 = BANKING77_DIR


def blobs(n_per: int, centers: int, dim: int = 16, spread: float = 0.15, seed: int = 0):
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((centers, dim))
    labels = np.repeat(np.arange(centers), n_per)
    points = means[labels] + spread * rng.standard_normal((len(labels), dim))
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    order = rng.permutation(len(labels))
    return points[order].astype(np.float32), labels[order]


def adjusted_rand(a, b) -> float:
    table = pd.crosstab(np.asarray(a), np.asarray(b)).to_numpy()
    index = comb(table, 2).sum()
    rows, cols = comb(table.sum(1), 2).sum(), comb(table.sum(0), 2).sum()
    expected = rows * cols / comb(table.sum(), 2)
    return float((index - expected) / ((rows + cols) / 2 - expected))


def test_retrain_triggers_at_growth_and_keeps_ids():
    points, _ = blobs(60, 6)
    clusters = OnlineClusters(16, radius=0.7, background=False, retrain_min=100, retrain_growth=2.0)
    for vec in points[:150]:
        clusters.assign(vec)
    assert len(clusters.retrains) == 1 and clusters.seen == 150   # at 100; next at 201
    before = [clusters.nearest(v)[0] for v in points]
    report = clusters.retrain()
    after = [clusters.nearest(v)[0] for v in points]
    assert report.kept_ids == report.k and report.mean_match_similarity > 0.9
    assert np.mean(np.equal(before, after)) >= 0.95
    for vec in points[150:]:
        clusters.assign(vec)
    assert len(clusters.retrains) == 3  # the 2x step at 201 (plus the manual one)


def test_new_ids_are_fresh_and_never_reused():
    clusters = OnlineClusters(2, radius=0.99, background=False, retrain_min=10**9)
    for angle in np.linspace(0, np.pi / 2, 30):
        clusters.assign(np.array([np.cos(angle), np.sin(angle)], np.float32))
    old = set(clusters.ids())
    clusters.k = 3                      # fewer clusters: most ids retire
    report = clusters.retrain()
    assert report.k == 3 and report.retired_ids == len(old) - report.kept_ids
    clusters.k = 8
    clusters.retrain()
    fresh = set(clusters.ids()) - old
    assert all(i >= len(old) for i in fresh)


def test_state_round_trip_keeps_ids():
    points, _ = blobs(20, 4, seed=3)
    clusters = OnlineClusters(16, radius=0.7)
    labels = [clusters.assign(v) for v in points]
    copy = OnlineClusters(16, radius=0.7)
    copy.load_state(clusters.export_state())
    assert [copy.nearest(v)[0] for v in points] == [clusters.nearest(v)[0] for v in points]
    assert copy.assign(-points[0]) == max(labels) + 1  # next id continues, never reuses


@pytest.fixture(scope="module")
def banking_sample(minilm_embedder):
    frame = pd.read_csv(f"{BANKING77}/train.csv").sample(1000, random_state=7)
    return minilm_embedder.encode(frame.text.tolist()), frame.category.to_numpy()


def test_banking77_purity_improves_with_retrains_and_ids_stay_stable(banking_sample):
    vecs, intents = banking_sample
    online = OnlineClusters(vecs.shape[1], background=False, retrain_min=10**9)
    retrained = OnlineClusters(vecs.shape[1], background=False, retrain_min=250)
    for vec in vecs:
        online.assign(vec)
        retrained.assign(vec)
    assert len(retrained.retrains) == 2  # at 250 and 501
    online_ari = adjusted_rand(intents, [online.nearest(v)[0] for v in vecs])
    before = [retrained.nearest(v)[0] for v in vecs]
    retrained_ari = adjusted_rand(intents, before)
    # Measured on this sample: online 0.32, retrained 0.35 (banking77 intents overlap).
    assert retrained_ari > 0.3 and retrained_ari > online_ari - 0.02
    retrained.retrain()
    after = [retrained.nearest(v)[0] for v in vecs]
    assert np.mean(np.equal(before, after)) > 0.85  # measured 0.97
