"""Events finished off the request path: the sampled ANN check runs in the executor,
the event stays complete, one per request, in decision order (manual executor, no sleeps)."""
from __future__ import annotations

import numpy as np
import pytest

from cache_core.publish.event_worker import EventWorker
from cache_core.experiments import ArmConfig
from cache_core.store.faiss import IndexSpec
from tests.unit.cache_core.helpers import at_cosine, unit_vec
from tests.unit.cache_core.test_cache import E0, make_cache


class ManualExecutor:
    """Holds jobs until the test runs them; reports its queue as the backlog."""

    def __init__(self, backlog: int = 0):
        self.jobs, self.extra_backlog = [], backlog

    def submit(self, job) -> None:
        self.jobs.append(job)

    def backlog(self) -> int:
        return len(self.jobs) + self.extra_backlog

    def run_all(self) -> None:
        while self.jobs:
            self.jobs.pop(0)()


def checked_cache(executor, index_kind="flat"):
    arm = ArmConfig(name="a", threshold=0.8, ann_check_rate=1.0, index_kind=index_kind)
    table = {"q": E0, "p": at_cosine(0.9), "r": at_cosine(0.85), "far": unit_vec(0, 0, 1)}
    return make_cache(table, arm, event_executor=executor)


def test_checked_event_is_emitted_by_the_executor_complete_and_once():
    executor = ManualExecutor()
    cache, _, sink, _ = checked_cache(executor)
    cache.store("q", "ans", unit_id="u")
    result = cache.lookup("p", unit_id="u")
    assert result.hit and result.answer == "ans" and result.latency_ms >= result.embed_ms
    assert sink.events == [] and not result.pending.done()  # the answer left first
    executor.run_all()
    assert len(sink.events) == 1 and result.pending.done()
    event = sink.events[0]
    assert event is result.event and event.request_id == result.request_id
    assert event.ann_checked and event.ann_agree and event.ann_recall_at_k == 1.0
    assert event.decision == "hit" and event.similarity == pytest.approx(0.9, abs=1e-5)
    assert event.latency_ms == result.latency_ms and event.entry_age_s == result.entry_age_s


def test_events_leave_in_decision_order_checked_or_not():
    executor = ManualExecutor()
    cache, _, sink, _ = checked_cache(executor)
    cache.store("q", "ans", unit_id="u")
    ids = [cache.lookup(text, unit_id="u").request_id for text in ("p", "far", "r")]
    executor.run_all()
    assert [e.request_id for e in sink.events] == ids
    assert all(e.ann_checked for e in sink.events)


def test_long_backlog_skips_the_check_but_not_the_event():
    executor = ManualExecutor(backlog=10_000)
    cache, _, sink, _ = checked_cache(executor)
    cache.store("q", "ans", unit_id="u")
    cache.lookup("p", unit_id="u")
    executor.run_all()
    assert len(sink.events) == 1 and not sink.events[0].ann_checked
    assert sink.events[0].ann_agree is None and sink.events[0].decision == "hit"


def test_stepped_exact_scan_equals_one_piece_exact_search():
    rng = np.random.default_rng(3)
    vecs = rng.standard_normal((40, 8)).astype(np.float32)
    table = {f"t{i}": v for i, v in enumerate(vecs)}
    cache, _, _, _ = make_cache(table, ArmConfig(name="a", threshold=0.99, index_kind="hnsw"))
    for i in range(40):
        cache.store(f"t{i}", "a", unit_id="u")
    partition = cache.partitions()[0]
    index = partition.indexes[""]
    for row in vecs[:10]:
        vec = row / np.linalg.norm(row)
        stepped = partition._exact_many_in_steps(vec[None], None, 5, block_rows=7)[0]
        assert [e for e, _ in stepped] == [e for e, _ in index.exact_search(vec, 5)]


def test_stepped_scan_restarts_when_the_partition_changes_mid_scan():
    cache, _, _, _ = make_cache({"q": E0, "p": at_cosine(0.9), "r": at_cosine(0.5)})
    for text in ("q", "p", "r"):
        cache.store(text, text, unit_id="u")
    partition = cache.partitions()[0]
    index = partition.indexes[""]
    real_block, calls = index.exact_block_many, []

    def block_then_mutate(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 1:
            partition.mutations += 1  # as if a store landed between two blocks
        return real_block(*args, **kwargs)

    index.exact_block_many = block_then_mutate
    outcome = partition.ann_check(E0, None, raw=index.search(E0, 5))
    assert outcome.ann_checked and outcome.ann_agree and outcome.ann_recall_at_k == 1.0
    assert calls[:2] == [0, 0]  # the first scan was abandoned and restarted from row 0


def test_event_worker_runs_jobs_in_order_and_flushes():
    worker = EventWorker()
    seen = []
    for i in range(50):
        worker.submit(lambda i=i: seen.append(i))
    assert worker.flush(5.0) and seen == list(range(50))
    worker.close()
    worker.submit(lambda: seen.append("after close"))  # runs in the caller, never lost
    assert seen[-1] == "after close"


@pytest.mark.parametrize("index_kind", ["flat", "hnsw"])
def test_a_store_after_the_lookup_does_not_count_against_the_index(index_kind):
    """The check runs after the answer left; by then the caller has usually stored the
    model's reply to the miss (the chat endpoint does): the exact search must compare
    with the entries the lookup could see, not with that newer, identical entry."""
    executor = ManualExecutor()
    cache, _, sink, _ = checked_cache(executor, index_kind)
    cache.store("q", "ans", unit_id="u")
    miss = cache.lookup("far", unit_id="u")
    cache.store("far", "upstream reply", unit_id="u")  # cosine 1.0 to the lookup
    executor.run_all()
    event = sink.events[0]
    assert event.request_id == miss.request_id and event.decision == "miss"
    assert event.ann_checked and event.ann_agree and event.ann_recall_at_k == 1.0


def test_an_entry_removed_after_the_lookup_does_not_count_against_the_index():
    executor = ManualExecutor()
    cache, _, sink, _ = checked_cache(executor)
    for text in ("q", "r"):
        cache.store(text, text, unit_id="u")
    hit = cache.lookup("p", unit_id="u")
    partition = cache.partitions()[0]
    with partition.lock:  # a "wrong" verdict, an eviction or a purge, before the check ran
        partition.remove(hit.entry_id)
    executor.run_all()
    event = sink.events[0]
    assert event.ann_checked and event.ann_agree and event.ann_recall_at_k == 1.0


def test_an_index_rebuilt_since_the_lookup_leaves_the_event_unchecked():
    executor = ManualExecutor()
    cache, _, sink, exp = checked_cache(executor)
    cache.store("q", "ans", unit_id="u")
    cache.lookup("p", unit_id="u")
    partition = cache.partitions()[0]
    with partition.lock:  # the arm moved to another index kind: a new structure
        partition.reconfigure(IndexSpec(kind="hnsw"), partition.capacity_entries, partition.capacity_bytes)
    executor.run_all()
    event = sink.events[0]
    assert event.decision == "hit" and not event.ann_checked and event.ann_agree is None
