"""Judge features kept between training runs: reused for the same pairs, never stale, never fatal."""
from __future__ import annotations

import numpy as np

from cache_core.decision.judge_feature_store import KEEP_FILES, FeatureStore
from cache_core.decision.judge_train import featurise, train
from tests.unit.cache_core.decision.test_judge import fake_encode, fake_tokens, labelled_pairs


class Counting:
    """``featurise`` over the fake encoders, counting the pairs it computed."""

    def __init__(self):
        self.computed = 0

    def __call__(self, pairs):
        self.computed += len(pairs)
        return featurise(list(pairs), fake_encode, fake_tokens)


def test_the_same_pairs_are_featurised_once_and_relabelled_pairs_reuse_them(tmp_path):
    store, compute = FeatureStore(tmp_path, "fake|int8"), Counting()
    pairs = labelled_pairs(60, seed=3)
    first = store.features(pairs, compute)
    relabelled = [(c, q, 1 - y) for c, q, y in pairs]
    assert np.array_equal(store.features(relabelled, compute), first)
    assert compute.computed == 60
    store.features(pairs[:-1], compute)
    FeatureStore(tmp_path, "fake|fp32").features(pairs, compute)  # another encoder: other numbers
    assert compute.computed == 60 + 59 + 60


def test_a_corrupt_or_misshapen_file_is_recomputed(tmp_path):
    store, compute = FeatureStore(tmp_path, "fake"), Counting()
    pairs = labelled_pairs(20, seed=1)
    path = tmp_path / f"features-{store.key(pairs)}.npy"
    expected = store.features(pairs, compute)
    path.write_bytes(b"not a numpy file")
    assert np.array_equal(store.features(pairs, compute), expected)
    np.save(path, np.zeros((3, 2)))
    assert np.array_equal(store.features(pairs, compute), expected)
    assert compute.computed == 60


def test_an_unwritable_directory_still_trains(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    store, compute = FeatureStore(blocker / "sub", "fake"), Counting()
    assert store.features(labelled_pairs(10, seed=2), compute).shape[0] == 10


def test_old_files_are_pruned(tmp_path):
    store, compute = FeatureStore(tmp_path, "fake"), Counting()
    for n in range(KEEP_FILES + 3):
        store.features(labelled_pairs(6 + n, seed=n), compute)
    assert len(list(tmp_path.glob("features-*.npy"))) == KEEP_FILES


def test_train_with_a_store_gives_the_same_judge_and_skips_the_features_the_second_time(tmp_path, monkeypatch):
    from cache_core.decision import judge_train

    pairs = labelled_pairs(300, seed=4)
    plain = train([], pairs, fake_encode, fake_tokens, version="s1", encoder="fake", seed=1)
    store = FeatureStore(tmp_path, "fake")
    stored = train([], pairs, fake_encode, fake_tokens, version="s1", encoder="fake", seed=1, store=store)
    monkeypatch.setattr(judge_train, "featurise", lambda *a, **k: (_ for _ in ()).throw(AssertionError("recomputed")))
    again = train([], pairs, fake_encode, fake_tokens, version="s1", encoder="fake", seed=1, store=store)
    assert stored.operating_points == plain.operating_points == again.operating_points
