"""Storing many answers at once (SemanticCache.store_many, POST /v1/store/batch): one encode,
one fsync, per-item admission; every_arm warms each arm's store; a bad item stores nothing."""
from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from cache_core.cache import SemanticCache
from cache_core.records import InvalidRequest, StoreItem
from cache_core.experiments import ArmConfig
from cache_core.registry import ExperimentRegistry, UnknownExperiment
from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from tests.unit.cache_core.helpers import ManualClock, RecordingPublisher, TableEmbedder, experiment, unit_in_arm, unit_vec

TABLE = {"reset my pin": unit_vec(1, 0), "pin reset please": unit_vec(0.97, 0.24),
         "open an account": unit_vec(0, 1), "close my account": unit_vec(0, 0, 1)}


class CountingEmbedder(TableEmbedder):
    def __init__(self, table):
        super().__init__(table)
        self.calls: list[int] = []

    def encode_with_norms(self, texts):
        self.calls.append(len(texts))
        return super().encode_with_norms(texts)


def _cache(mode: str = "partitioned"):
    exp = experiment(ArmConfig(name="a", threshold=0.9), ArmConfig(name="b", threshold=0.9), mode=mode)
    embedder = CountingEmbedder(dict(TABLE))
    return SemanticCache(embedder, ExperimentRegistry({exp.experiment_id: exp}), clock=ManualClock()), exp, embedder


def test_items_are_encoded_once_and_admitted_one_by_one():
    cache, exp, embedder = _cache()
    unit = unit_in_arm(exp, "a")
    items = [StoreItem("reset my pin", "Card > PIN", unit), StoreItem("pin reset please", "Card > PIN", unit),
             StoreItem("open an account", "Accounts > Open", unit)]
    results = cache.store_many(items)
    assert embedder.calls == [3]
    assert [[r.reason for r in per_item] for per_item in results] == [["admitted"], ["near_duplicate"], ["admitted"]]
    assert cache.lookup("pin reset please", unit).answer == "Card > PIN"
    assert not cache.lookup("open an account", unit_in_arm(exp, "b")).hit  # arm a's store only


@pytest.mark.parametrize("mode, stores", [("partitioned", 2), ("shared", 1)])
def test_every_arm_warms_each_store_of_the_experiment(mode, stores):
    cache, exp, _ = _cache(mode)
    results = cache.store_many([StoreItem("reset my pin", "Card > PIN", "seed")], every_arm=True)
    assert len(results[0]) == stores and all(r.stored for r in results[0])
    assert sorted(r.arm for r in results[0]) == (["a", "b"] if mode == "partitioned" else ["a"])
    for arm in ("a", "b"):
        assert cache.lookup("pin reset please", unit_in_arm(exp, arm)).hit


def test_a_bad_item_stores_nothing_and_names_its_index():
    cache, exp, embedder = _cache()
    good = StoreItem("reset my pin", "Card > PIN", "u1")
    with pytest.raises(InvalidRequest, match="item 1: answer must be a non-empty string"):
        cache.store_many([good, StoreItem("open an account", " ", "u1")])
    with pytest.raises(UnknownExperiment):
        cache.store_many([good, StoreItem("open an account", "x", "u1", experiment_id="nope")])
    assert embedder.calls == [] and sum(len(p) for p in cache.partitions()) == 0


@pytest.fixture()
def api(minilm_embedder):
    app = create_app(build_components(Settings(service={"open_access": True}), RecordingPublisher(), minilm_embedder))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def test_batch_endpoint_seeds_every_arm(api):
    items = [{"query": "How do I reset my password?", "answer": "Use the reset link.", "unit_id": "seed"},
             {"query": "When will my card arrive?", "answer": "Within 5 working days.", "unit_id": "seed",
              "provenance": {"source": "faq", "version": "3"}}]
    response = api.post("/v1/store/batch", json={"items": items, "every_arm": True})
    body = response.json()
    assert response.status_code == 200, response.text
    arms = [a["name"] for a in api.get("/v1/experiments").json()["experiments"][0]["arms"]]
    assert body["stored"] == 2 * len(arms) and [len(r) for r in body["results"]] == [len(arms)] * 2
    for i in range(40):  # units of every arm (and some holdout) find it
        looked = api.post("/v1/lookup", json={"query": "how can I reset my password", "unit_id": f"user-{i}"}).json()
        assert looked["hit"] or looked["arm"] == "holdout", looked
    assert "scache_stores_total" in api.get("/metrics").text


@pytest.mark.parametrize("body, reason", [
    ({"items": []}, "at least 1"),
    ({"items": [{"query": "q", "answer": "a", "unit_id": "u"}] * 513}, "at most 512"),
    ({"items": [{"query": "q", "answer": "a", "unit_id": "u"}, {"query": "", "answer": "a", "unit_id": "u"}]},
     "item 1: query must be a non-empty string"),
    ({"items": [{"query": "q", "answer": "a", "unit_id": "u", "experiment_id": "nope"}]}, "nope"),
    ({"items": [{"query": "q", "unit_id": "u"}]}, "answer"),
])
def test_batch_endpoint_refuses_bad_input_with_a_reason(api, body, reason):
    response = api.post("/v1/store/batch", json=body)
    assert 400 <= response.status_code < 500 and reason in response.text, response.text
    assert api.get("/healthz").json()["entries"] == 0


def test_seed_cli_sends_a_file_in_batches_into_every_arm(api, tmp_path, capsys):
    from cache_core import seed
    path = tmp_path / "faq.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"query": "How do I reset my password?", "answer": "Use the reset link.", "ttl_s": 600},
        {"query": "When will my card arrive?", "answer": "Within 5 working days.",
         "provenance": {"source": "faq", "version": "3"}},
        {"query": "How do I close my account?", "answer": "Settings > Close."}]) + "\n")
    assert seed.main([str(path), "--batch", "2"], client=api) == 0
    out = capsys.readouterr().out
    arms = len(api.get("/v1/experiments").json()["experiments"][0]["arms"])
    assert f"seeded 3 records: {3 * arms} entries stored" in out
    assert api.get("/healthz").json()["entries"] == 3 * arms


def test_seed_cli_checks_the_whole_file_first(api, tmp_path, capsys):
    from cache_core import seed
    path = tmp_path / "faq.csv"
    path.write_text("query,answer,ttl_s\nHow do I reset my password?,Use the reset link.,\n,no query,\n"
                    "When will my card arrive?,Within 5 days.,soon\n")
    assert seed.main([str(path)], client=api) == 2
    err = capsys.readouterr().err
    assert "2 bad records, nothing sent" in err and "faq.csv:3: query must be a non-empty string" in err
    assert "faq.csv:4: ttl_s must be a number, got 'soon'" in err and "Traceback" not in err
    assert api.get("/healthz").json()["entries"] == 0
    assert seed.main([str(tmp_path / "missing.jsonl")], client=api) == 2
    assert "no such file" in capsys.readouterr().err


def test_seed_cli_stops_at_a_refused_batch_and_says_where_to_resume(api, tmp_path, capsys):
    from cache_core import seed
    path = tmp_path / "faq.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"query": "How do I reset my password?", "answer": "Use the reset link."},
        {"query": "When will my card arrive?", "answer": "Within 5 days.", "experiment_id": "gone"}]) + "\n")
    assert seed.main([str(path), "--batch", "1"], client=api) == 1
    err = capsys.readouterr().err
    assert "refused records 1-1 (404" in err and "resume with --skip 1" in err
    assert api.get("/healthz").json()["entries"] > 0  # the first batch stays stored
