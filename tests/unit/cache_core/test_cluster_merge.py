"""Merging intent clusters: concurrent opens of one intent on two replicas, and near-identical
centroids at a retrain (cache_core.clusters)."""
from __future__ import annotations

import itertools
import json
import time
from types import SimpleNamespace

import numpy as np

from cache_core.clusters import ClusterModel, OnlineClusters
from tests.unit.cache_core.test_cluster_retrain import blobs

DIM = 4
PIN = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
PIN_PARAPHRASE = np.array([0.97, 0.24, 0.0, 0.0], np.float32) / np.float32(np.hypot(0.97, 0.24))  # cos 0.97
ACCOUNT = np.array([0.0, 0.0, 1.0, 0.0], np.float32)  # another intent: cos 0


def _replica(name: str, **kw):
    """A fleet replica's clusters, and the opens it published (id, vec, at_ms, origin)."""
    clusters = OnlineClusters(DIM, radius=0.8, background=False, retrain_min=10**9, **kw)
    clusters.fleet_ids, clusters.origin = True, name
    opens: list[tuple] = []
    clusters.listener = SimpleNamespace(
        cluster_opened=lambda cid, vec, at_ms: opens.append((cid, vec, at_ms, name)),
        clusters_retrained=lambda model: None)
    return clusters, opens


def _deliver(opens, clusters: OnlineClusters) -> list[bool]:
    return [clusters.adopt_open(cid, vec, at_ms, origin=origin) for cid, vec, at_ms, origin in opens]


def _counts(clusters: OnlineClusters) -> dict[int, int]:
    state = clusters.export_state()
    return dict(zip(state["ids"], state["counts"]))


def test_one_intent_opened_on_two_replicas_at_once_ends_as_one_id_on_both():
    a, opens_a = _replica("a")
    b, opens_b = _replica("b")
    id_a = a.assign(PIN)                  # both open before either open reached the other
    id_b = b.assign(PIN_PARAPHRASE)
    assert id_a != id_b and len(opens_a) == len(opens_b) == 1
    for _ in range(3):
        a.assign(PIN)
    (_, _, at_a, _), (_, _, at_b, _) = opens_a[0], opens_b[0]
    survivor, loser = sorted([(at_a, id_a), (at_b, id_b)])
    survivor, loser = survivor[1], loser[1]

    _deliver(opens_b, a)
    _deliver(opens_a, b)

    assert a.ids() == b.ids() == [survivor]
    assert a.merged_ids == b.merged_ids == {loser: survivor}
    assert a.merges == b.merges == {"concurrent_open": 1}
    assert a.assign(PIN_PARAPHRASE) == b.assign(PIN) == survivor
    assert sum(_counts(a).values()) == 5 + (loser == id_a)  # a's 4 and the paraphrase (+ b's open, if it won)
    assert _deliver(opens_b + opens_a, a) == [False, False]  # redelivered: nothing comes back
    assert a.ids() == [survivor]


def test_the_earlier_open_survives_whether_it_is_the_local_or_the_arriving_one():
    a, opens_a = _replica("a")
    local = a.assign(PIN)
    a.assign(PIN)
    at = opens_a[0][2]
    assert a.adopt_open(7_000_000, PIN_PARAPHRASE, at - 100, origin="b")  # earlier: it survives
    assert a.ids() == [7_000_000] and _counts(a) == {7_000_000: 3}  # 1 + the local cluster's 2
    c, _ = _replica("c")
    assert c.adopt_open(7_000_000, PIN_PARAPHRASE, at - 100, origin="b")
    assert not c.adopt_open(local, PIN, at, origin="a")                 # later: not added
    assert c.ids() == [7_000_000] and c.merged_ids == {local: 7_000_000}


def _at_degrees(deg: float) -> np.ndarray:
    return np.array([np.cos(np.deg2rad(deg)), np.sin(np.deg2rad(deg)), 0, 0], np.float32)


def test_a_local_query_near_a_concurrent_open_joins_it_instead_of_opening():
    a, opens_a = _replica("a")
    assert a.adopt_open(7_000_000, _at_degrees(0), int(time.time() * 1000), origin="b")
    for deg in (30, 40, 50, 55, 60, 60):  # a's own traffic drifts the centroid away from the open
        assert a.assign(_at_degrees(deg)) == 7_000_000
    probe = _at_degrees(-35)  # cos 0.82 to b's opening vector, under the radius to the centroid
    assert a.nearest(probe)[1] < a.radius
    assert a.assign(probe) == 7_000_000  # opening here would make a second id b merges away
    assert opens_a == [] and a.ids() == [7_000_000]


def test_opens_of_different_intents_at_once_both_survive():
    a, opens_a = _replica("a")
    b, opens_b = _replica("b")
    id_a, id_b = a.assign(PIN), b.assign(ACCOUNT)
    _deliver(opens_b, a)
    _deliver(opens_a, b)
    assert sorted(a.ids()) == sorted(b.ids()) == sorted([id_a, id_b])
    assert a.merged_ids == b.merged_ids == {}


def test_same_intent_opens_farther_apart_than_the_window_both_survive():
    window = 2000
    c, _ = _replica("c", concurrent_open_window_ms=window)
    assert c.adopt_open(5_000_001, PIN, 100_000, origin="a")
    assert c.adopt_open(5_000_002, PIN_PARAPHRASE, 100_000 + window + 1, origin="b")
    assert c.ids() == [5_000_001, 5_000_002]
    assert not c.adopt_open(5_000_003, PIN_PARAPHRASE, 100_000 + window, origin="b")  # at the edge: merged
    assert c.merged_ids == {5_000_003: 5_000_001}


def test_opens_without_an_origin_or_from_one_origin_are_never_merged():
    c, _ = _replica("c")
    assert c.adopt_open(5_000_001, PIN, 100_000)            # the old call, no origin
    assert c.adopt_open(5_000_002, PIN_PARAPHRASE, 100_000)
    assert c.adopt_open(5_000_003, PIN, 100_000, origin="a")
    assert c.adopt_open(5_000_004, PIN_PARAPHRASE, 100_000, origin="a")
    assert len(c) == 4 and c.merged_ids == {}


def test_a_chain_of_concurrent_opens_ends_the_same_in_any_arrival_order():
    # x ~ y and y ~ z (cos 0.87), x !~ z (cos 0.5): one intent, whichever arrives first.
    angle = np.deg2rad
    opens = [(5_000_001, np.array([1, 0, 0, 0]), 1_000, "a"),
             (5_000_002, np.array([np.cos(angle(30)), np.sin(angle(30)), 0, 0]), 1_010, "b"),
             (5_000_003, np.array([np.cos(angle(60)), np.sin(angle(60)), 0, 0]), 1_005, "c")]
    outcomes = set()
    for order in itertools.permutations(opens):
        d, _ = _replica("d")
        _deliver(order, d)
        outcomes.add(tuple(d.ids()))
    assert outcomes == {(5_000_001,)}


def test_a_model_that_names_a_merged_away_id_is_read_as_its_survivor():
    c, _ = _replica("c")
    assert c.adopt_open(5_000_001, PIN, 1_000, origin="a")
    assert not c.adopt_open(5_000_002, PIN_PARAPHRASE, 1_010, origin="b")
    # b retrained before a's open reached it: its model still has its own id for the intent.
    model = ClusterModel(generation=1, origin="b", trained_at_ms=2_000, ids=[5_000_002, 6_000_000],
                         counts=[10, 4], centroids=np.stack([PIN_PARAPHRASE, ACCOUNT]))
    assert c.adopt_model(model)
    assert c.ids() == [5_000_001, 6_000_000]
    assert c.nearest(PIN)[0] == 5_000_001


def test_merges_survive_a_snapshot_and_an_old_snapshot_still_loads():
    a, _ = _replica("a")
    assert a.adopt_open(5_000_001, PIN, 1_000, origin="b")
    assert not a.adopt_open(5_000_002, PIN_PARAPHRASE, 1_010, origin="c")
    state = a.export_state()
    state.pop("centroids")
    state = json.loads(json.dumps(state))  # what persistence writes to clusters.json
    state["centroids"] = a.export_state()["centroids"]
    restored, _ = _replica("a")
    restored.load_state(state)
    assert restored.merged_ids == {5_000_002: 5_000_001}
    assert not restored.adopt_open(5_000_002, PIN_PARAPHRASE, 1_010, origin="c")   # still a loser
    assert not restored.adopt_open(5_000_009, PIN_PARAPHRASE, 1_020, origin="d")   # still remembered
    assert restored.ids() == [5_000_001]

    old = {key: value for key, value in a.export_state().items() if key not in ("opens", "merged_ids")}
    legacy = OnlineClusters(DIM)
    legacy.load_state(old)
    assert legacy.ids() == [5_000_001] and legacy.merged_ids == {}


def test_a_retrain_merges_near_identical_centroids_and_reports_them():
    points, _ = blobs(60, 3, seed=5)
    results = {}
    for merge_above in (0.92, 1.01):  # 1.01: never merge
        clusters = OnlineClusters(16, radius=0.6, background=False, retrain_min=10**9, merge_above=merge_above)
        for vec in points:
            clusters.assign(vec)
        assert len(clusters) == 3
        first = clusters.nearest(points[0])[0]
        duplicate = points[0] + 0.05 * np.random.default_rng(1).standard_normal(16).astype(np.float32)
        duplicate /= np.linalg.norm(duplicate)
        assert clusters.nearest(duplicate)[1] >= 0.95
        clusters.adopt_open(99, duplicate, 0)  # a second cluster of the same intent, as drift leaves one
        report = clusters.retrain()
        results[merge_above] = (report, clusters.ids(), clusters.merged_ids, first)
    report, ids, merged, first = results[0.92]
    assert report.k == 3 and report.merged_ids == 1 and report.retired_ids >= 1
    assert 99 not in ids and merged == {99: first}  # the larger cluster survives
    report, ids, merged, _ = results[1.01]
    assert report.k == 4 and report.merged_ids == 0 and merged == {}


def test_the_retrain_merge_survivor_is_the_larger_cluster_then_the_smaller_id():
    clusters = OnlineClusters(2, merge_above=0.9)
    centroids = np.array([[1, 0], [0.99, 0.141], [0, 1]], np.float32)
    ids, _, counts, merges = clusters._merge_close([7, 3, 5], centroids, [2, 2, 9])
    assert ids == [3, 5] and counts == [4, 9] and merges == [(7, 3)]
    ids, _, _, merges = clusters._merge_close([7, 3, 5], centroids, [3, 2, 9])
    assert ids == [7, 5] and merges == [(3, 7)]


def test_a_merge_while_a_retrain_runs_is_not_undone_by_the_retrain():
    class FollowerDuringKmeans(OnlineClusters):
        during = staticmethod(lambda: None)

        def _kmeans(self, sample, k, init):
            fitted = super()._kmeans(sample, k, init)
            self.during()  # the entries follower's thread, adopting an open meanwhile
            return fitted

    points, _ = blobs(20, 2, seed=2)
    clusters = FollowerDuringKmeans(16, radius=0.6, background=False, retrain_min=10**9)
    clusters.fleet_ids, clusters.origin = True, "a"
    opens: list[tuple] = []
    clusters.listener = SimpleNamespace(cluster_opened=lambda *args: opens.append(args),
                                        clusters_retrained=lambda model: None)
    for vec in points:
        clusters.assign(vec)
    assert len(opens) == 2
    loser, vec, at_ms = opens[0]
    clusters.during = lambda: clusters.adopt_open(7_000_000, vec, at_ms - 100, origin="b")
    assert clusters.retrain() is not None
    assert loser not in clusters.ids() and 7_000_000 in clusters.ids() and len(clusters) == 2


def test_an_open_whose_rival_a_model_retired_is_kept_as_on_its_own_replica():
    """b is opened where the model in use has retired a (so it opens as usual there); a replica
    on the same model that still remembers a's open must keep b too, not merge it into a."""
    c, _ = _replica("c")
    a_id, b_id = 5_000_001, 5_000_002
    assert c.adopt_open(a_id, PIN, 1_000, origin="a")
    other = np.array([0.0, 1.0, 0.0, 0.0], np.float32)
    model = ClusterModel(generation=1, origin="a", trained_at_ms=1_500, ids=[6_000_000], counts=[9],
                         centroids=other[None, :])
    assert c.adopt_model(model) and a_id not in c.ids()  # a is retired by the model

    assert c.adopt_open(b_id, PIN_PARAPHRASE, 1_800, origin="b")
    assert b_id in c.ids() and b_id not in c.merged_ids
