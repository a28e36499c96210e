"""The learned judge: training, its artifact, loading by version, and what a bad file does."""
from __future__ import annotations

import hashlib
import json
import logging

import numpy as np
import pytest

from cache_core.decision.judge import JUDGE_UNAVAILABLE, JUDGE_VETO, Unavailable, shelf_judges
from cache_core.decision.judge_features import FEATURE_NAMES, TokenVectors, pair_features, words
from cache_core.decision.judge_model import JudgeArtifact, JudgeLoadError, JudgeShelf, artifact_name
from cache_core.decision.judge_pairs_file import PairsError, read_pairs, read_pairs_file
from cache_core.decision.judge_train import main as train_main, train
from cache_core.decision.rule import HitRule
from cache_core.experiments import ArmConfig, JudgeConfig
from tests.unit.cache_core.decision.test_rule import candidate


def _unit(word: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "little")
    v = np.random.default_rng(seed).normal(size=16)
    return v / np.linalg.norm(v)


def fake_tokens(texts):
    """Word vectors by hash: the same word aligns perfectly, different words barely."""
    out = []
    for text in texts:
        ws = sorted(words(text)) or ["empty"]
        out.append(TokenVectors(np.array([_unit(w) for w in ws]), ws))
    return out


def fake_encode(texts):
    vecs = np.array([np.mean([_unit(w) for w in (sorted(words(t)) or ["empty"])], axis=0) for t in texts])
    return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def cos(a: str, b: str) -> float:
    va, vb = fake_encode([a, b])
    return float(va @ vb)


TOPICS = ["card", "pin", "transfer", "refund", "loan", "account", "fee", "limit", "app", "cash"]
VERBS = ["reset", "change", "cancel", "check", "order", "close", "raise", "find"]


TEMPLATES = ["{verb} {topic} please, how", "how do i {verb} my {topic} please", "how can i {verb} my {topic}"]


def labelled_pairs(n: int = 600, seed: int = 1) -> list[tuple[str, str, int]]:
    """A stored "how do i VERB my TOPIC" asked again reworded: 1; reworded with another verb: 0."""
    rng = np.random.default_rng(seed)
    pairs = []
    for i in range(n):
        topic, verb, template = rng.choice(TOPICS), rng.choice(VERBS), rng.choice(TEMPLATES)
        asked = verb if i % 2 else rng.choice([v for v in VERBS if v != verb])
        pairs.append((f"how do i {verb} my {topic}", template.format(verb=asked, topic=topic), int(i % 2)))
    return pairs


@pytest.fixture(scope="module")
def artifact() -> JudgeArtifact:
    return train(labelled_pairs(), [], fake_encode, fake_tokens, version="t1", encoder="fake", seed=3)


def test_features_have_the_pinned_names_and_see_the_word_that_differs():
    same, other = fake_tokens(["how do i reset my pin", "reset pin how"]), fake_tokens(["how do i cancel my pin"])
    f_same = dict(zip(FEATURE_NAMES, pair_features("how do i reset my pin", "reset pin how", 0.9, *same)))
    f_other = dict(zip(FEATURE_NAMES, pair_features("how do i reset my pin", "how do i cancel my pin", 0.9,
                                                    same[0], other[0])))
    assert len(f_same) == len(FEATURE_NAMES)
    assert f_same["align_worst"] > 0.99 > 0.6 > f_other["align_worst"]
    assert f_other["unaligned"] >= 2 and f_same["unaligned"] == 0


def test_training_is_deterministic_under_a_seed(artifact):
    again = train(labelled_pairs(), [], fake_encode, fake_tokens, version="t1", encoder="fake", seed=3)
    body = {k: v for k, v in artifact.to_json().items() if k not in ("report", "sha256")}
    assert body == {k: v for k, v in again.to_json().items() if k not in ("report", "sha256")}


def test_the_trained_judge_separates_the_pairs_and_reports_operating_points(artifact):
    report = artifact.report
    assert report["auc"] > 0.95
    assert set(artifact.operating_points) == {"0.02", "0.05", "0.10"}
    assert report["operating_points"]["0.05"]["recall"] > 0.9


def test_an_artifact_round_trips_through_its_file(tmp_path, artifact):
    path = artifact.save(tmp_path)
    assert path.name == "judge-t1.json"
    loaded = JudgeArtifact.load(path)
    X = np.random.default_rng(0).random((50, len(FEATURE_NAMES)))
    assert np.allclose(loaded.probabilities(X), artifact.probabilities(X))
    assert loaded.operating_points == artifact.operating_points


@pytest.mark.parametrize("damage, message", [
    (lambda text: text[: len(text) // 2], "not readable JSON"),
    (lambda text: text.replace('"baseline": ', '"baseline": 1', 1), "digest does not match"),
    (lambda text: json.dumps({**json.loads(text), "format": "other/9"}), "format"),
])
def test_a_damaged_artifact_is_a_clear_error(tmp_path, artifact, damage, message):
    path = artifact.save(tmp_path)
    path.write_text(damage(path.read_text()))
    with pytest.raises(JudgeLoadError, match=message):
        JudgeArtifact.load(path)


def test_versions_are_file_names_never_paths():
    with pytest.raises(ValueError):
        artifact_name("../etc/passwd")
    with pytest.raises(ValueError):
        JudgeConfig(version="../x")


def test_the_shelf_serves_judged_lookups_and_misses_while_the_file_is_bad(tmp_path, artifact, caplog):
    clock = [0.0]
    shelf = JudgeShelf(tmp_path, tokens=lambda: fake_tokens, retry_s=30, clock=lambda: clock[0])
    rule = HitRule(judges=shelf_judges(shelf))
    arm = ArmConfig(name="a", threshold=0.1, judge=JudgeConfig(version="t1"))
    query = "how can i reset my card"
    cands = [candidate("how do i cancel my card", cos(query, "how do i cancel my card")),
             candidate("how do i reset my card", cos(query, "how do i reset my card"))]
    (tmp_path / "judge-t1.json").write_text("{not json")
    with caplog.at_level(logging.ERROR):
        decision = rule.decide(query, cands, arm, cluster=0)
    assert not decision.hit and decision.guard == JUDGE_UNAVAILABLE
    assert "judge unavailable" in caplog.text and shelf.error("t1")
    artifact.save(tmp_path)  # fixed on disk: picked up after the retry interval, no restart
    assert not rule.decide(query, cands, arm, cluster=0).hit
    clock[0] = 31.0
    decision = rule.decide(query, cands, arm, cluster=0)
    assert decision.hit and decision.served.entry.query == "how do i reset my card"
    assert decision.judge_version == "t1" and decision.judge_probability > 0.5
    only_wrong = rule.decide(query, cands[:1], arm, cluster=0)
    assert not only_wrong.hit and only_wrong.guard == JUDGE_VETO


def test_a_new_version_in_the_config_is_used_by_the_next_lookup(tmp_path, artifact):
    artifact.save(tmp_path)
    JudgeArtifact(**{**artifact.__dict__, "version": "t2", "operating_points": {"0.05": 1.01}}).save(tmp_path)
    rule = HitRule(judges=shelf_judges(JudgeShelf(tmp_path, tokens=lambda: fake_tokens)))
    cands = [candidate("how do i reset my card", cos("how can i reset my card", "how do i reset my card"))]
    v1 = ArmConfig(name="a", threshold=0.1, judge=JudgeConfig(version="t1"))
    assert rule.decide("how can i reset my card", cands, v1, cluster=0).hit
    v2 = v1.model_copy(update={"judge": JudgeConfig(version="t2")})  # the control topic's next config
    decision = rule.decide("how can i reset my card", cands, v2, cluster=0)
    assert decision.judge_version == "t2" and not decision.hit


def test_missing_versions_are_unavailable_not_errors(tmp_path):
    lookup = shelf_judges(JudgeShelf(tmp_path, tokens=lambda: fake_tokens))
    got = lookup(ArmConfig(name="a", judge=JudgeConfig(version="nope")))
    assert isinstance(got, Unavailable) and got.on_unavailable == "miss"


def test_pairs_files_csv_and_jsonl(tmp_path):
    csv_file = tmp_path / "p.csv"
    csv_file.write_text("query,cached_query,label\nreset pin,how to reset my pin,1\nclose card,reset pin,wrong\n")
    assert read_pairs(csv_file) == [("how to reset my pin", "reset pin", 1), ("reset pin", "close card", 0)]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"query": "a", "cached_query": "b", "label": true}\n{"query": "c", "cached_query": "d", "label": 0}\n')
    assert [p[2] for p in read_pairs(jsonl)] == [1, 0]


def test_pairs_files_exported_elsewhere_read_with_their_own_column_names(tmp_path, caplog):
    # Quora's question pairs as published: quoted fields, a question with a newline in it,
    # a row whose second question is empty (skipped and counted, not a failed file).
    qqp = tmp_path / "quora.csv"
    qqp.write_text('"id","qid1","qid2","question1","question2","is_duplicate"\n'
                   '"0","1","2","How do I learn Python?","How can I learn Python\nquickly?","1"\n'
                   '"1","3","4","How do I learn Python?","How do I learn Java?","0"\n'
                   '"2","5","6","What is this?","","0"\n')
    read = read_pairs_file(qqp)
    assert read.pairs == [("How do I learn Python?", "How can I learn Python\nquickly?", 1),
                          ("How do I learn Python?", "How do I learn Java?", 0)]
    assert read.skipped_blank == 1 and "skipped 1 rows with an empty question" in caplog.text
    glue = tmp_path / "pairs.tsv"
    glue.write_text("sentence1\tsentence2\tlabel\nreset pin\thow to reset my pin\t1.0\nreset pin\tclose card\t0.0\n")
    assert read_pairs(glue) == [("reset pin", "how to reset my pin", 1), ("reset pin", "close card", 0)]


def test_max_pairs_trains_on_a_seeded_sample(tmp_path, monkeypatch):
    from cache_core.decision import judge_train

    rows = "".join(f"q{i},c{i},{i % 2}\n" for i in range(400))
    (tmp_path / "p.csv").write_text("query,cached_query,label\n" + rows)
    seen = []

    class Trained(Exception):
        pass

    def record(own, *args, **kwargs):
        seen.append(own)
        raise Trained

    monkeypatch.setattr(judge_train, "training_encoders", lambda settings: (None, None))
    monkeypatch.setattr(judge_train, "train", record)
    for _ in range(2):
        with pytest.raises(Trained):
            train_main(["--pairs", str(tmp_path / "p.csv"), "--max-pairs", "100", "--out", str(tmp_path)])
    assert len(seen[0]) == 100 and seen[0] == seen[1] and {p[2] for p in seen[0]} == {0, 1}
    with pytest.raises(SystemExit) as refused:
        train_main(["--pairs", str(tmp_path / "p.csv"), "--max-pairs", "3"])
    assert refused.value.code == 2


def test_feature_progress_says_how_long_is_left_and_when_to_sample():
    from cache_core.decision.judge_train import _progress

    assert _progress(256, 3000, 5.0) == "5 s, ~54 s to go"
    a_quora_sized_file = _progress(256, 400_000, 5.0)
    assert a_quora_sized_file.startswith("5 s, ~2.2 h to go") and "--max-pairs N" in a_quora_sized_file


@pytest.mark.parametrize("content, message", [
    ("query,cached_query,label\na,b,maybe\n", "neither"),
    ("query,cached_query\na,b\n", "needs query, cached_query and label"),
    ("question1,question2,is_duplicate\na,b,\n", "row 2 has no label"),
    ("query,cached_query,label\na,b,1\nc,d,1\n", "both correct and wrong"),
])
def test_bad_pairs_files_are_one_line_errors(tmp_path, capsys, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(PairsError, match=message):
        read_pairs(path)
    assert train_main(["--pairs", str(path), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_token_cache_encodes_each_text_once_and_stays_bounded():
    from cache_core.decision.judge_tokens import TokenVectorCache

    calls = []

    def counting(texts):
        calls.append(list(texts))
        return fake_tokens(texts)

    cache = TokenVectorCache(counting, capacity=3)
    first = cache(["new question", "cached a", "cached b"])
    again = cache(["another question", "cached a", "cached b", "cached a"])
    assert calls == [["new question", "cached a", "cached b"], ["another question"]]
    assert again[1] is first[1] and again[3] is first[1]
    assert cache.encoded == 4
    cache(["x", "y"])  # capacity 3: the least recently used texts fall out
    cache(["new question"])
    assert calls[-1] == ["new question"]


@pytest.fixture(scope="module")
def min_blend_artifact() -> JudgeArtifact:
    return train(labelled_pairs(), [], fake_encode, fake_tokens, version="t1", encoder="fake", seed=3, blend="min")


def test_the_blend_keeps_a_candidate_low_on_cosine_low_whatever_the_trees_say(min_blend_artifact):
    artifact = min_blend_artifact
    assert artifact.blend is not None and artifact.blend.kind == "min"
    X = np.tile(np.median(np.array(artifact_features_sample()), axis=0), (2, 1))
    X[0, 0], X[1, 0] = 0.99, 0.05  # the same words, one far below every trained cosine
    high, low = artifact.probabilities(X)
    assert high > low
    assert artifact.blend(np.array([1e9]), np.array([-1.0]))[0] < 0.01


def test_with_own_labels_the_blend_is_the_one_serving_most_on_their_held_out_rows():
    from cache_core.decision.judge_train import choose_blend

    rng = np.random.default_rng(0)
    y = rng.random(2000) < 0.5
    raw = np.where(y, 2.0, -2.0) + rng.normal(0, 0.5, 2000)  # the trees separate the kinds
    useless_cosine = rng.random(2000)  # the cosine says nothing in this domain
    scores = {kind: mix for kind, (_, mix) in blends(raw, useless_cosine).items()}
    choice = choose_blend(scores, y.astype(int))
    assert choice["chosen"] is None and choice["served"]["none"] > 0.9 > choice["served"]["min"] + 0.3
    tied = choose_blend({kind: raw for kind in scores}, y.astype(int))
    assert tied["chosen"] == "min"  # the same order every way: the safest blend wins the tie


def blends(raw, cosine):
    from cache_core.decision.judge_model import CosineBlend
    from cache_core.decision.judge_train import BLEND_CANDIDATES

    return {kind: (None, raw if kind is None else CosineBlend.fit(kind, raw, cosine)(raw, cosine))
            for kind in BLEND_CANDIDATES}


def test_with_own_labels_every_own_pair_is_scored_out_of_fold_and_the_cut_rests_on_all_of_them():
    own = labelled_pairs(300, seed=6)
    artifact = train(own, labelled_pairs(200, seed=7), fake_encode, fake_tokens, version="t8", encoder="fake",
                     seed=2, folds=5)
    assert artifact.report["holdout_rows"] == len(own) and artifact.report["train_rows"] == 500
    assert artifact.report["operating_points_rule"] == "out of fold over the own pairs (5 folds)"
    split_one = train(own, labelled_pairs(200, seed=7), fake_encode, fake_tokens, version="t8", encoder="fake",
                      seed=2, folds=1)
    assert split_one.report["holdout_rows"] == round(len(own) * 0.2)
    again = train(own, labelled_pairs(200, seed=7), fake_encode, fake_tokens, version="t8", encoder="fake",
                  seed=2, folds=5)  # deterministic under a seed
    X = artifact_features_sample()
    assert again.operating_points == artifact.operating_points
    assert np.array_equal(again.probabilities(X), artifact.probabilities(X))


def test_auto_blend_on_public_sets_alone_keeps_the_min_blend():
    pairs = labelled_pairs(400, seed=4)
    sources = ["a" if i % 2 else "b" for i in range(len(pairs))]
    artifact = train([], pairs, fake_encode, fake_tokens, version="t9", encoder="fake", seed=1,
                     extra_sources=sources)
    assert artifact.blend.kind == "min" and artifact.report["blend_choice"] is None


def artifact_features_sample():
    from cache_core.decision.judge_train import featurise
    return featurise(labelled_pairs(40, seed=5), fake_encode, fake_tokens)


def test_a_version_1_artifact_without_a_blend_still_loads(tmp_path, artifact):
    from dataclasses import replace

    from cache_core.decision.judge_model import _digest

    body = replace(artifact, blend=None).to_json()
    body.pop("sha256")
    body.pop("blend")
    body["format"] = "scache-judge/1"
    (tmp_path / "judge-t1.json").write_text(json.dumps(body | {"sha256": _digest(body)}))
    loaded = JudgeArtifact.load(tmp_path / "judge-t1.json")
    X = np.random.default_rng(1).random((20, len(FEATURE_NAMES)))
    assert loaded.blend is None
    assert np.allclose(loaded.probabilities(X), artifact.calibration(artifact.trees.raw(X)))


def _public_sets() -> tuple[list, list]:
    pairs = labelled_pairs(800, seed=2)
    sources = ["easy" if i % 3 else "hard" for i in range(len(pairs))]
    # the "hard" set has a third of its duplicates mislabelled: its own cut must be stricter
    noisy = [(a, b, 0 if (s == "hard" and y == 1 and i % 9 == 1) else y)
             for i, ((a, b, y), s) in enumerate(zip(pairs, sources))]
    return noisy, sources


def test_trained_on_public_sets_alone_each_cut_is_the_strictest_over_the_sets():
    noisy, sources = _public_sets()
    judged = train([], noisy, fake_encode, fake_tokens, version="t2", encoder="fake", seed=0, extra_sources=sources,
                   shared_cut="sources")
    per_source = judged.report["source_operating_points"]
    assert judged.report["operating_points_rule"] == "strictest over sources"
    for key, cut in judged.operating_points.items():
        assert cut == max(judged.report["operating_points"][key]["accept_at"],
                          *(pts[key]["accept_at"] for pts in per_source.values() if pts[key]["false_hit"] is not None))


def test_trained_on_public_sets_alone_the_cut_also_holds_on_each_set_left_out():
    """The default: each set left out in turn; the shipped cut is no looser than the sources' rule and
    serves on the held-out rows no more of the known duplicates than the smallest share that holding the
    target on a left-out set cost."""
    from cache_core.decision.judge_cuts import served_share
    from cache_core.decision.judge_train import featurise, split

    noisy, sources = _public_sets()
    judged = train([], noisy, fake_encode, fake_tokens, version="t3", encoder="fake", seed=0, extra_sources=sources)
    report = judged.report
    assert report["operating_points_rule"] == "strictest over sources, then kinds left out"
    assert set(report["kind_left_out_points"]) == {"easy", "hard"}
    before = report["operating_points_by_rule"]["strictest over sources"]
    assert report["operating_points_by_rule"]["kinds left out"] == judged.operating_points
    assert before == train([], noisy, fake_encode, fake_tokens, version="t3", encoder="fake", seed=0,
                           extra_sources=sources, shared_cut="sources").operating_points
    y = np.array([p[2] for p in noisy])
    _, ho = split(len(y), y, 0.2, 0)
    X = featurise(noisy, fake_encode, fake_tokens)
    for key, cut in judged.operating_points.items():
        assert cut >= before[key]
        shares = [pts[key]["known_share"] for pts in report["kind_left_out_points"].values()
                  if pts[key]["known_share"] is not None]
        if shares:
            assert served_share(judged.probabilities(X[ho]), y[ho], cut) <= min(shares) + 1e-9
        # the report reads the shipped cut on the held-out rows, not the rows' own looser one
        shipped = report["shipped_operating_points"][key]
        assert shipped["accept_at"] == cut and shipped["recall"] == served_share(judged.probabilities(X[ho]), y[ho], cut)


def test_the_summary_names_what_the_shipped_cut_serves_and_where_the_rows_alone_would_cut():
    """judge-train's closing lines: each target's shipped cut with its served and wrong shares on the
    held-out rows; the held-out rows' own cut only where the shipped one differs; a hint to bring labels
    when trained on public sets alone."""
    from cache_core.decision.judge_report import summary_lines

    noisy, sources = _public_sets()
    public = train([], noisy, fake_encode, fake_tokens, version="t4", encoder="fake", seed=0, extra_sources=sources)
    lines = summary_lines(public)
    for key, line in zip(public.report["operating_points"], lines):
        shipped = public.report["shipped_operating_points"][key]
        assert f"accept_at {public.operating_points[key]:.3f}, serving {shipped['recall']:.1%}" in line
        raised = abs(public.report["operating_points"][key]["accept_at"] - public.operating_points[key]) > 1e-9
        assert ("at the held-out rows' own cut" in line) == raised
    assert "--pairs FILE or --warehouse" in lines[-1]
    own = train(noisy[:400], [], fake_encode, fake_tokens, version="t5", encoder="fake", seed=0)
    assert not any("own cut" in line or "--pairs" in line for line in summary_lines(own))


def test_warehouse_verdicts_fold_into_pairs_one_per_request_the_users_first():
    from cache_core.decision.judge_verdicts import pairs_from_rows

    found = pairs_from_rows([
        ("r1", "shadow", "wrong", "q1", "c1"), ("r1", "user", "correct", "q1", "c1"),
        ("r2", "shadow", "correct", "q2", "c2"), ("r3", "user", "wrong", None, None),
    ])
    assert sorted(found.pairs) == [("c1", "q1", 1), ("c2", "q2", 1)]
    assert found.by_source == {"user": 1, "shadow": 1} and found.without_text == 1


def test_train_from_an_unreachable_warehouse_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("SCACHE_CLICKHOUSE__URL", "http://127.0.0.1:9")
    from cache_core.settings import get_settings
    get_settings.cache_clear()
    try:
        code = train_main(["--warehouse", "--version", "w1"])
    finally:
        get_settings.cache_clear()
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("judge_train: cannot read verdicts from http://127.0.0.1:9") and "\n" not in err


def test_operating_points_keep_their_target_on_fresh_pairs_more_often_than_the_point_estimate():
    from cache_core.decision.judge_cuts import CUT_CONFIDENCE, operating_points

    def draw(rng, n):  # duplicates score higher on average; the tail still holds some non-duplicates
        y = (rng.random(n) < 0.5).astype(int)
        return 1 / (1 + np.exp(-rng.normal(np.where(y == 1, 1.5, 0.0), 1.0))), y

    fresh_s, fresh_y = draw(np.random.default_rng(99), 200_000)
    over = {0.5: 0, CUT_CONFIDENCE: 0}
    for seed in range(40):
        s, y = draw(np.random.default_rng(seed), 1000)
        for confidence in over:
            cut = operating_points(s, y, confidence)["0.05"]["accept_at"]
            served = fresh_s >= cut
            over[confidence] += served.any() and (fresh_y[served] == 0).mean() > 0.05
    assert over[CUT_CONFIDENCE] <= 17 and over[0.5] >= 24, over  # of 40 held-out draws


def test_exported_trees_score_exactly_as_sklearn_missing_values_included():
    from sklearn.ensemble import HistGradientBoostingClassifier

    from cache_core.decision.judge_train import fit_trees

    rng = np.random.default_rng(4)
    X = rng.normal(size=(600, len(FEATURE_NAMES)))
    y = (X[:, 0] + 0.5 * X[:, 3] + rng.normal(scale=0.5, size=600) > 0).astype(int)
    X[::9, 3] = np.nan
    trees = fit_trees(X, y, seed=0)
    reference = HistGradientBoostingClassifier(
        max_iter=300, learning_rate=0.05, max_leaf_nodes=15, min_samples_leaf=40, l2_regularization=1.0,
        monotonic_cst=[1] + [0] * (len(FEATURE_NAMES) - 1), early_stopping=False, random_state=0).fit(X, y)
    assert np.allclose(trees.raw(X), reference.decision_function(X), atol=1e-9)
