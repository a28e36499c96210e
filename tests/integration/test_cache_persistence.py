"""A restart loses no acknowledged store: kill -9 the service, start it again, all hits."""
from __future__ import annotations

import httpx
import pandas as pd
import pytest

from infra.runtime import free_port
from infra.runtime import BANKING77_DIR

pytestmark = pytest.mark.integration

N = 25


def test_kill_minus_9_then_restart_keeps_every_acknowledged_store(cache_service_factory, tmp_path):
    questions = (pd.read_csv(BANKING77_DIR / "train.csv")
                 .drop_duplicates("category").text.head(N).tolist())
    env = {"SCACHE_CACHE__SNAPSHOT_DIR": str(tmp_path / "snapshots"),
           "SCACHE_CACHE__SNAPSHOT_INTERVAL_S": "3600",          # the log alone must suffice
           "SCACHE_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"}  # no broker needed
    base = cache_service_factory(env=env)
    with httpx.Client(base_url=base, timeout=30) as client:
        for i, question in enumerate(questions):
            stored = client.post("/v1/store", json={"query": question, "answer": f"answer {i}",
                                                    "unit_id": "u1"}).json()
            assert stored["stored"], stored
        fsyncs = client.get("/healthz").json()["persistence"]["fsyncs"]
    assert fsyncs == N
    cache_service_factory.services[-1].kill()                  # SIGKILL: no shutdown hook

    base = cache_service_factory(env=env)
    with httpx.Client(base_url=base, timeout=30) as client:
        health = client.get("/healthz").json()
        assert health["entries"] == N and health["persistence"]["restored_entries"] == N
        for i, question in enumerate(questions):
            answer = client.post("/v1/lookup", json={"query": question, "unit_id": "u1"}).json()
            assert answer["hit"] and answer["answer"] == f"answer {i}", (question, answer)
    service = cache_service_factory.services[-1]
    service.stop()                                             # SIGTERM: final snapshot
    assert "cache snapshot written" in service.log_path.read_text()

    base = cache_service_factory(env=env)
    with httpx.Client(base_url=base, timeout=30) as client:
        persistence = client.get("/healthz").json()["persistence"]
        assert persistence["restored_entries"] == N and persistence["log_records"] == 0
        assert client.post("/v1/lookup", json={"query": questions[0], "unit_id": "u1"}).json()["hit"]
    cache_service_factory.services[-1].stop()
