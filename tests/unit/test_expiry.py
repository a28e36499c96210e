"""Background expiry (cache_core.expiry): a store no request reaches any more loses its
expired entries, which lazy expiry alone never removes (bench/soak.py found them piling up)."""
from __future__ import annotations

from fastapi.testclient import TestClient

from cache_core.cache import SemanticCache
from cache_core.experiments import ArmConfig
from cache_core.expiry import ExpirySweeper
from cache_core.registry import ExperimentRegistry
from cache_core.service import create_app
from cache_core.settings import Settings
from infra.runtime import wait_until
from tests.unit.cache_helpers import ManualClock, RecordingPublisher, TableEmbedder, experiment, unit_vec


def make_cache():
    exp = experiment(ArmConfig(name="a", threshold=0.8))
    clock = ManualClock()
    table = {"old question": unit_vec(1.0), "kept question": unit_vec(0.0, 1.0)}
    cache = SemanticCache(TableEmbedder(table), ExperimentRegistry({exp.experiment_id: exp}), clock=clock)
    return cache, clock


def entries(cache, namespace: str) -> int:
    return sum(len(p) for p in cache.partitions() if p.key[0] == namespace)


def test_a_sweep_removes_the_expired_entries_of_a_namespace_nobody_asks_any_more():
    cache, clock = make_cache()
    assert cache.store("old question", "a", unit_id="u", namespace="abandoned", ttl_s=10).stored
    assert cache.store("kept question", "b", unit_id="u", namespace="busy", ttl_s=1000).stored
    clock.advance(20)
    # Lazy expiry alone: a request to another namespace leaves the abandoned one's entry in place.
    assert cache.lookup("kept question", unit_id="u", namespace="busy").hit
    assert entries(cache, "abandoned") == 1
    sweeper = ExpirySweeper(cache, interval_s=60)
    assert sweeper.sweep() == 1
    assert entries(cache, "abandoned") == 0 and entries(cache, "busy") == 1
    assert sweeper.sweep() == 0
    assert sweeper.stats()["sweeps"] == 2 and sweeper.stats()["removed"] == 1


def test_the_thread_sweeps_on_its_interval_and_stops():
    cache, clock = make_cache()
    cache.store("old question", "a", unit_id="u", namespace="abandoned", ttl_s=10)
    clock.advance(20)
    sweeper = ExpirySweeper(cache, interval_s=0.02).start()
    try:
        wait_until(lambda: sweeper.removed == 1, 5, "a background sweep")
    finally:
        sweeper.stop()
    assert not sweeper.stats()["alive"] and entries(cache, "abandoned") == 0


def test_the_service_sweeps_in_the_background_and_reports_it(minilm_embedder):
    clock = ManualClock()
    app = create_app(Settings(), RecordingPublisher(), minilm_embedder, clock=clock, expiry_sweep_s=0.02)
    with TestClient(app) as client:
        stored = client.post("/v1/store", json={"query": "How do I close my account?", "answer": "Settings.",
                                                "unit_id": "u1", "namespace": "trial-7", "ttl_s": 5})
        assert stored.status_code == 200 and stored.json()["stored"]
        assert client.get("/healthz").json()["entries"] == 1
        clock.advance(10)
        wait_until(lambda: client.get("/healthz").json()["entries"] == 0, 5, "the service's sweep")
        assert client.get("/healthz").json()["expiry"]["removed"] == 1
    assert not app.state.expiry.stats()["alive"]  # stopped with the app
