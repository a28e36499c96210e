"""Purging a namespace's answers of one provenance source (a document that changed), of one
version, or of one question (SemanticCache.purge), on every replica, and over the admin API."""
from __future__ import annotations

import pytest

from cache_core.records import EntryMatch, InvalidRequest
from cache_core.state.replication import EntryFollower
from tests.unit.cache_core.helpers import ManualClock, TableEmbedder, unit_in_arm, unit_vec
from tests.unit.cache_core.state.test_replication import KAFKA, MODEL, _deliver, _replica
from tests.unit.cache_core.service.test_service_chat_admin import TOKEN, make_client

POLICY, POLICY_PARAPHRASE, HOURS = "what is the refund policy", "how do refunds work", "when are you open"


def _embedder() -> TableEmbedder:
    return TableEmbedder({POLICY: unit_vec(1, 0), POLICY_PARAPHRASE: unit_vec(0.97, 0.24), HOURS: unit_vec(0, 1)})


def _seeded(name: str = "a", clock=None):
    cache, feed, follower, exp = _replica(name, clock or ManualClock(), embedder=_embedder())
    units = {arm: unit_in_arm(exp, arm) for arm in ("a", "b")}
    for unit in units.values():
        cache.store(POLICY, "30 days.", unit, provenance_source="refund-policy", provenance_version="3")
        cache.store(HOURS, "9 to 5.", unit, provenance_source="opening-hours", provenance_version="1")
        cache.store(POLICY, "30 days.", unit, namespace="tenant-x", provenance_source="refund-policy")
    return cache, feed, follower, units


def _hit(cache, query: str, unit: str, namespace: str = "default") -> bool:
    return cache.lookup(query, unit, namespace=namespace).hit


def test_a_source_is_purged_from_every_arm_of_the_namespace_only():
    cache, _, _, units = _seeded()
    assert cache.purge("default", EntryMatch(provenance_source="refund-policy")) == 2
    for unit in units.values():
        assert not _hit(cache, POLICY_PARAPHRASE, unit)
        assert _hit(cache, HOURS, unit)
        assert _hit(cache, POLICY, unit, namespace="tenant-x")


def test_a_version_or_a_question_narrows_the_purge():
    cache, _, _, units = _seeded()
    assert cache.purge("default", EntryMatch(provenance_source="refund-policy", provenance_version="2")) == 0
    assert cache.purge("default", EntryMatch(query="  When are you OPEN ")) == 2  # as stored: spacing, case
    assert all(_hit(cache, POLICY, u) and not _hit(cache, HOURS, u) for u in units.values())


@pytest.mark.parametrize("fields, reason", [
    ({}, "needs provenance_source or query"),
    ({"provenance_version": "3"}, "provenance_version needs provenance_source"),
])
def test_a_purge_must_name_what_it_removes(fields, reason):
    with pytest.raises(InvalidRequest, match=reason):
        EntryMatch(**fields)


def test_the_purge_reaches_the_other_replica_and_a_late_older_put_stays_out(tmp_path):
    clock = ManualClock()
    a, feed_a, follower_a, units = _seeded("a", clock)
    b, feed_b, _, _ = _replica("b", clock, embedder=_embedder())
    follower_b = EntryFollower(KAFKA, b, "b", MODEL, state_dir=tmp_path)
    late = feed_a.values[0]  # arm a's refund-policy entry, delivered after the purge below
    _deliver(feed_a.values[1:], follower_b)
    assert _hit(b, POLICY_PARAPHRASE, units["b"])

    clock.advance(10)
    a.purge("default", EntryMatch(provenance_source="refund-policy"))
    _deliver(feed_a.values[-1:], follower_b, start=len(feed_a.values))
    assert not _hit(b, POLICY_PARAPHRASE, units["b"]) and _hit(b, HOURS, units["b"])
    assert follower_b.stats()["purges"] == 1

    _deliver([late], follower_b, start=len(feed_a.values) + 1)
    assert follower_b.stats()["purged_before"] == 1 and not _hit(b, POLICY_PARAPHRASE, units["a"])
    follower_b._save_offsets()  # the purge is kept with the offsets, for late puts after a restart
    again = EntryFollower(KAFKA, b, "b", MODEL, state_dir=tmp_path)
    again.start_offsets()
    assert [(at, m.provenance_source) for at, m in again._purges["default"]] == [(clock(), "refund-policy")]

    b.store(POLICY, "45 days.", units["b"], provenance_source="refund-policy", provenance_version="4")
    assert _hit(b, POLICY_PARAPHRASE, units["b"])  # stored after the purge: the new answer stays


def test_admin_purge_needs_the_token_and_a_match(minilm_embedder, tmp_path):
    with make_client(minilm_embedder, tmp_path) as client:
        stored = client.post("/v1/store", json={"query": "What is your refund policy?", "answer": "30 days.",
                                                "unit_id": "u1", "provenance": {"source": "refund-policy"}})
        assert stored.json()["stored"]
        path = "/v1/admin/namespaces/default/purge"
        assert client.post(path, json={"provenance_source": "refund-policy"}).status_code == 401
        auth = {"authorization": f"Bearer {TOKEN}"}
        empty = client.post(path, json={}, headers=auth)
        assert empty.status_code == 422 and "needs provenance_source or query" in empty.text
        assert client.post(path, json={"provenance_source": 7}, headers=auth).status_code == 422
        purged = client.post(path, json={"provenance_source": "refund-policy"}, headers=auth)
        assert purged.status_code == 200 and purged.json() == {"namespace": "default", "removed": 1}
        assert not client.post("/v1/lookup", json={"query": "What is your refund policy?", "unit_id": "u1"}).json()["hit"]
