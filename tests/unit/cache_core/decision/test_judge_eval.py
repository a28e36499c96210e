import csv
import json

import numpy as np
import pytest

from cache_core.decision import judge_eval, judge_feature_store, judge_tokens
from cache_core.decision.judge_eval import cosine_oracle, evaluate, main as eval_main
from cache_core.decision.judge_train import featurise, train
from tests.unit.cache_core.decision.test_judge import fake_encode, fake_tokens, labelled_pairs


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    directory = tmp_path_factory.mktemp("judges")
    artifact = train(labelled_pairs(), [], fake_encode, fake_tokens, version="e1", encoder="fake", seed=3)
    artifact.save(directory)
    return directory, artifact


@pytest.fixture
def fake_cache_encoder(monkeypatch):
    from cache_core.settings import get_settings

    monkeypatch.setattr(judge_tokens, "training_encoders", lambda settings: (fake_encode, fake_tokens))
    monkeypatch.setattr(judge_feature_store, "feature_store_for", lambda settings, disabled=False: None)
    monkeypatch.setattr(get_settings().cache, "model", "fake")


def test_a_judged_arm_serves_what_reaches_both_its_floor_and_its_cut(trained):
    _, artifact = trained
    pairs = labelled_pairs(300, seed=9)  # never trained on
    X, y = featurise(pairs, fake_encode, fake_tokens), np.array([p[2] for p in pairs])
    prob, floor = artifact.probabilities(X), float(np.median(X[:, 0]))
    result = evaluate(artifact, X, y, floor)
    for key, row in result.items():
        served = (X[:, 0] >= floor) & (prob >= artifact.accept_at(float(key)))
        assert row["hits"] == served.sum() and row["wrong"] == (served & (y == 0)).sum()
        assert row["recall"] == pytest.approx((served & (y == 1)).sum() / y.sum())
        assert row["recall"] <= row["oracle_recall"] + 1e-12 or row["false_hit"] > float(key)
    assert evaluate(artifact, X, y, 0.0)["0.10"]["recall"] > 0.5  # separable by the word that differs
    nothing = evaluate(artifact, X, y, floor=1.01)
    assert all(r["hits"] == 0 and r["oracle_recall"] == 0.0 for r in nothing.values())


def test_the_cosine_oracle_is_the_best_threshold_on_these_pairs():
    X = np.array([[0.99], [0.95], [0.90], [0.80]])
    y = np.array([1, 0, 1, 1])
    assert cosine_oracle(X, y)["0.05"] == pytest.approx(1 / 3)  # only 0.99 is served without a wrong hit
    assert cosine_oracle(X, y)["0.10"] == pytest.approx(1 / 3)


def test_the_command_prints_a_table_and_writes_a_report(trained, fake_cache_encoder, tmp_path, capsys):
    directory, _ = trained
    with open(tmp_path / "later.csv", "w", newline="") as f:
        csv.writer(f).writerows([("cached_query", "query", "label"), *labelled_pairs(200, seed=11)])
    report = tmp_path / "out" / "eval.json"
    assert eval_main(["--pairs", str(tmp_path / "later.csv"), "--version", "e1", "--dir", str(directory),
                      "--floor", "0.1", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "200 pairs, 100 duplicates; floor 0.10" in out and "| 5% |" in out and "judge e1" in out
    saved = json.loads(report.read_text())
    assert saved["rows"] == 200 and set(saved["judges"]["e1"]) == {"0.02", "0.05", "0.10"}
    assert report.with_suffix(".png").stat().st_size > 0


@pytest.mark.parametrize("args, message", [
    (["--version", "nope"], "does not exist"),
    (["--version", "../e1"], "version"),
    (["--version", "e1", "--pairs-file-is-missing"], None),
])
def test_bad_input_is_one_line_and_exit_2(trained, fake_cache_encoder, tmp_path, capsys, args, message):
    directory, _ = trained
    (tmp_path / "p.csv").write_text("cached_query,query,label\na b,a c,1\nd e,f g,0\n")
    argv = ["--pairs", str(tmp_path / "p.csv"), "--dir", str(directory), *args]
    if message is None:
        with pytest.raises(SystemExit) as refused:
            eval_main(argv)
        assert refused.value.code == 2
        return
    assert eval_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("judge_eval: ") and message in err and "\n" not in err


def test_a_judge_of_another_encoder_is_refused(trained, tmp_path, capsys, monkeypatch):
    directory, _ = trained
    monkeypatch.setattr(judge_tokens, "training_encoders", lambda settings: pytest.fail("encoded anyway"))
    (tmp_path / "p.csv").write_text("cached_query,query,label\na b,a c,1\nd e,f g,0\n")
    assert eval_main(["--pairs", str(tmp_path / "p.csv"), "--version", "e1", "--dir", str(directory)]) == 2
    assert "reads fake's vectors" in capsys.readouterr().err


def test_a_floor_that_is_no_cosine_is_refused(tmp_path):
    with pytest.raises(SystemExit) as refused:
        judge_eval.main(["--pairs", str(tmp_path / "p.csv"), "--version", "v", "--floor", "2"])
    assert refused.value.code == 2
