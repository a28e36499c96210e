"""Batched ANN checks (cache_core.store.ann_check): the same results as single checks on every
index kind with deleted and expired entries, a full queue that drops without blocking and
counts, a shutdown that drains, and the events that carry the results."""
from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import generate_latest

from cache_core.store.ann_check import AnnChecker
from cache_core.publish.event_worker import EventWorker
from cache_core.experiments import ArmConfig
from cache_core.registry import ExperimentRegistry
from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.service.metrics import ServiceMetrics
from cache_core.settings import Settings
from tests.unit.cache_core.helpers import RecordingPublisher, TableEmbedder, experiment
from tests.unit.cache_core.test_cache import make_cache
from tests.unit.cache_core.publish.test_event_worker import ManualExecutor

DIM = 16
ENTRIES = 400  # enough to train IVF with nlist 4 (39 points per list)
ARMS = {
    "flat": ArmConfig(name="a", threshold=0.99, ann_check_rate=1.0, index_kind="flat",
                      capacity_entries=10_000),
    "ivf": ArmConfig(name="a", threshold=0.99, ann_check_rate=1.0, index_kind="ivf", ivf_nlist=4,
                     ivf_nprobe=1, capacity_entries=10_000),
    "hnsw": ArmConfig(name="a", threshold=0.99, ann_check_rate=1.0, index_kind="hnsw", hnsw_m=8,
                      hnsw_ef_search=8, capacity_entries=10_000),
    # Compressed and hashed kinds re-score their candidates exactly: one candidate
    # leaves only the codes' ranking, so they disagree with exact search sometimes.
    "sq_int4": ArmConfig(name="a", threshold=0.99, ann_check_rate=1.0, index_kind="sq_int4",
                         ann_candidates=1, capacity_entries=10_000),
    "hnsw_sq_int8": ArmConfig(name="a", threshold=0.99, ann_check_rate=1.0, index_kind="hnsw_sq_int8",
                              hnsw_m=8, hnsw_ef_search=8, ann_candidates=1, capacity_entries=10_000),
    "semhash": ArmConfig(name="a", threshold=0.99, ann_check_rate=1.0, index_kind="semhash",
                         ann_candidates=1, capacity_entries=10_000),
    # No copy beside its int8 codes: the exact scan reads every inverted list of them.
    "ivf_sq_int8": ArmConfig(name="a", threshold=0.99, ann_check_rate=1.0, index_kind="ivf_sq_int8",
                             ivf_nlist=4, ivf_nprobe=1, capacity_entries=10_000),
}


def clustered(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((12, DIM))
    vecs = centers[rng.integers(0, 12, n)] + 0.35 * rng.standard_normal((n, DIM))
    return (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype(np.float32)


def filled_cache(kind: str, entries: int = ENTRIES, **kwargs):
    """A cache whose partition holds ENTRIES entries: a tenth deleted, a tenth expired but
    still indexed (expiry is only applied when a search meets them), some in a scope."""
    vecs = clustered(entries, seed=0)
    table = {f"t{i}": v for i, v in enumerate(vecs)}
    cache, clock, sink, _ = make_cache(table, ARMS[kind], **kwargs)
    for i in range(entries):
        if i % 10 == 3:  # short-lived: expired below
            cache.store(f"t{i}", f"a{i}", unit_id="u", ttl_s=1.0)
        else:
            cache.store(f"t{i}", f"a{i}", unit_id="u", scope="conv" if i % 10 == 7 else None)
    partition = cache.partitions()[0]
    with partition.lock:
        for entry in list(partition.entries.values()):
            if int(entry.query[1:]) % 10 == 5:
                partition.remove(entry.entry_id)
    clock.advance(60.0)  # past ttl 1 s, and past the 30 s grace of near-duplicates
    return cache, clock, sink, partition


def until(condition, timeout_s: float = 10.0) -> bool:
    """Poll for what a background thread does (the batch runs there)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def queries(n: int = 40) -> np.ndarray:
    return clustered(n, seed=1)


@pytest.mark.parametrize("kind", list(ARMS))
def test_batched_check_equals_single_check_with_deleted_and_expired_entries(kind):
    cache, clock, _, partition = filled_cache(kind)
    index = partition.indexes[""]
    assert index.trained or kind == "flat"
    expired = {e.entry_id for e in partition.entries.values() if not e.alive(clock())}
    assert expired  # still in the index: both checks must see them alike
    qs = queries()
    raws = [index.search(q, 5) for q in qs]
    single = [partition.ann_check(q, None, raw) for q, raw in zip(qs, raws)]
    batched = partition.ann_check_many(qs, None, raws)
    assert len(batched) == len(single)
    for one, many in zip(single, batched):
        assert many.ann_checked and one.ann_checked
        assert (many.ann_agree, many.ann_recall_at_k) == (one.ann_agree, one.ann_recall_at_k)
    if kind != "flat":  # an ANN index with tiny search effort must disagree sometimes
        assert any(o.ann_recall_at_k < 1.0 for o in single)
    # The exact lists themselves, in several blocks: same ids, same order, same scores.
    stepped = partition._exact_many_in_steps(qs, None, 5, block_rows=7)
    deleted = {f"t{i}" for i in range(5, ENTRIES, 10)}
    for q, found in zip(qs, stepped):
        reference = index.exact_search(q, 5)
        assert [e for e, _ in found] == [e for e, _ in reference]
        assert [s for _, s in found] == pytest.approx([s for _, s in reference], abs=1e-5)
        assert not {partition.entries[e].query for e, _ in found} & deleted
    assert any(e in expired for found in stepped for e, _ in found)


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_batched_check_reads_only_its_scope(kind):
    _, _, _, partition = filled_cache(kind)
    qs = queries(10)
    scoped = partition.indexes["conv"]
    found = partition._exact_many_in_steps(qs, "conv", 5, block_rows=3)
    for q, rows in zip(qs, found):
        assert [e for e, _ in rows] == [e for e, _ in scoped.exact_search(q, 5)]
        assert all(partition.entries[e].scope == "conv" for e, _ in rows)
    # A scope with no index: not checked, like the single check.
    assert partition.ann_check_many(qs[:2], "gone", [[("x", 1.0)]] * 2)[0].ann_checked is False


def test_batched_scan_restarts_when_the_partition_changes_mid_scan():
    _, _, _, partition = filled_cache("hnsw")
    index = partition.indexes[""]
    real_block, starts = index.exact_block_many, []

    def block_then_mutate(mat, start, stop, k, **kwargs):
        starts.append(start)
        if len(starts) == 2:
            partition.mutations += 1  # as if a store landed between two blocks
        return real_block(mat, start, stop, k, **kwargs)

    index.exact_block_many = block_then_mutate
    qs = queries(4)
    raws = [index.search(q, 5) for q in qs]
    outcomes = partition.ann_check_many(qs, None, raws, block_cells=4 * 256)
    assert starts[:3] == [0, 256, 0]  # abandoned after the change, restarted from row 0
    for q, raw, outcome in zip(qs, raws, outcomes):
        assert outcome.ann_recall_at_k == partition.ann_check(q, None, raw).ann_recall_at_k


def test_events_carry_the_batched_results_in_decision_order():
    """Two identical caches, one checking singly, one in batches: the same lookups (some
    meet expired entries, removed on the way, as in service) give the same events."""
    executor, single_executor = ManualExecutor(), ManualExecutor()
    checker = AnnChecker(batch_size=8, max_wait_ms=60_000)  # runs when 8 are in
    cache, _, sink, _ = filled_cache("hnsw", event_executor=executor, ann_checker=checker)
    twin, _, twin_sink, _ = filled_cache("hnsw", event_executor=single_executor)
    texts = [f"t{i}" for i in range(0, 80, 10)] + ["unknown"]  # 9 lookups: batches of 8 and 1
    results = [cache.lookup(t, unit_id="u") for t in texts]
    for text in texts:
        twin.lookup(text, unit_id="u")
        single_executor.run_all()
    assert until(lambda: checker.stats()["checked"] == 8)  # the 9th waits for its minute-long deadline
    time.sleep(0.05)
    assert checker.stats()["checked"] == 8 and checker.stats()["pending"] == 1
    checker.close()  # ... or a drain
    executor.run_all()
    assert [e.request_id for e in sink.events] == [r.request_id for r in results]
    assert checker.stats()["batches"] == 2 and checker.stats()["checked"] == 9
    assert len(twin_sink.events) == len(sink.events) == 9
    for batched, single in zip(sink.events, twin_sink.events):
        assert batched.ann_checked and single.ann_checked and batched.similarity == single.similarity
        assert (batched.ann_agree, batched.ann_recall_at_k) == (single.ann_agree, single.ann_recall_at_k)
    # Lookups met expired entries and removed them: not counted against the index.
    assert cache.partitions()[0].expirations > 0 and twin.partitions()[0].expirations > 0


def test_batched_checks_judge_only_what_each_lookup_could_see():
    """Misses whose replies are stored before their batch runs (as /v1/chat/completions
    does): on a flat index every check must still agree with exact search."""
    checker = AnnChecker(batch_size=1000, max_wait_ms=60_000)
    executor = ManualExecutor()
    cache, _, sink, _ = filled_cache("flat", event_executor=executor, ann_checker=checker)
    removed = [f"t{i}" for i in range(5, 200, 10)]  # not in the cache: misses
    results = [cache.lookup(text, unit_id="u") for text in removed]
    assert not any(r.hit for r in results)
    for text in removed:
        cache.store(text, "the model's reply", unit_id="u")
    checker.close()  # runs the pending batch now, after the stores
    executor.run_all()
    assert len(sink.events) == len(removed) and checker.stats()["batches"] == 1
    assert all(e.ann_checked and e.ann_agree and e.ann_recall_at_k == 1.0 for e in sink.events)


def test_a_full_queue_drops_checks_without_blocking_counts_and_logs(caplog):
    checker = AnnChecker(batch_size=1000, max_wait_ms=60_000, max_pending=3)
    executor = ManualExecutor()
    cache, _, sink, _ = filled_cache("flat", entries=100, event_executor=executor, ann_checker=checker)
    executor.run_all()
    sink.events.clear()
    caplog.set_level(logging.WARNING, logger="cache_core.store.ann_check")
    started = time.perf_counter()
    results = [cache.lookup(f"t{i}", unit_id="u") for i in range(0, 100, 10)]
    assert time.perf_counter() - started < 2.0  # ten lookups never waited for a minute-long batch
    stats = checker.stats()
    assert stats["pending"] == 3 and stats["dropped"]["queue_full"] == 7
    assert any("dropped" in r.getMessage() and r.reason == "queue_full" for r in caplog.records)
    metrics = ServiceMetrics(cache, lambda: {})
    text = generate_latest(metrics.registry).decode()
    assert 'scache_ann_checks_dropped_total{reason="queue_full"} 7.0' in text
    assert "scache_ann_check_pending 3.0" in text
    checker.close()  # drains the three
    executor.run_all()
    checked = [e.ann_checked for e in sink.events]
    assert checked == [True] * 3 + [False] * 7
    assert [e.request_id for e in sink.events] == [r.request_id for r in results]
    assert all(e.ann_agree is None and e.ann_recall_at_k is None for e in sink.events[3:])


def test_shutdown_drains_pending_checks_at_once_and_later_ones_are_dropped():
    worker = EventWorker()
    checker = AnnChecker(batch_size=1000, max_wait_ms=60_000)
    cache, _, sink, _ = filled_cache("ivf", event_executor=worker, ann_checker=checker)
    assert cache.flush_events()
    sink.events.clear()
    for i in range(0, 60, 10):
        cache.lookup(f"t{i}", unit_id="u")
    started = time.perf_counter()
    checker.close()
    worker.close()
    assert time.perf_counter() - started < 10.0  # not the batch's minute
    assert len(sink.events) == 6 and all(e.ann_checked for e in sink.events)
    assert checker.stats()["checked"] == 6 and checker.stats()["pending"] == 0
    assert checker.submit(object(), None, np.zeros(DIM, np.float32), []) is None
    assert checker.stats()["dropped"]["closed"] == 1


def test_a_deadline_runs_a_partial_batch_and_a_failed_batch_leaves_events_unchecked():
    checker = AnnChecker(batch_size=1000, max_wait_ms=20)
    _, _, _, partition = filled_cache("flat", entries=60)
    q = queries(1)[0]
    future = checker.submit(partition, None, q, partition.indexes[""].search(q, 5))
    outcome = checker.wait(future)  # one check alone, after ~20 ms
    assert outcome is not None and outcome.ann_checked and outcome.ann_agree
    broken = checker.submit(object(), None, q, [("x", 1.0)])  # no ann_check_many: the batch fails
    assert checker.wait(broken) is None and checker.stats()["dropped"]["failed"] == 1
    checker.close()


def test_a_result_that_does_not_come_in_time_is_counted_as_a_timeout():
    checker = AnnChecker(batch_size=1000, max_wait_ms=60_000, result_timeout_s=0.05)
    _, _, _, partition = filled_cache("flat", entries=60)
    future = checker.submit(partition, None, queries(1)[0], [])
    assert checker.wait(future) is None and checker.stats()["dropped"]["timeout"] == 1
    checker.close()
    assert future.result(timeout=1).ann_checked  # close still ran it


def test_an_event_waiting_while_the_backlog_grows_hurries_its_batch():
    executor = ManualExecutor()
    checker = AnnChecker(batch_size=1000, max_wait_ms=60_000)
    cache, _, sink, _ = filled_cache("flat", entries=60, event_executor=executor, ann_checker=checker)
    for i in range(0, 40, 10):
        cache.lookup(f"t{i}", unit_id="u")
    # The first event starts waiting with a short backlog, which then grows (lookups keep
    # coming while events wait): past half of MAX_CHECK_BACKLOG its batch runs at once.
    threading.Timer(0.2, lambda: setattr(executor, "extra_backlog", 40)).start()
    started = time.perf_counter()
    executor.run_all()
    assert 0.15 < time.perf_counter() - started < 5.0  # not the minute-long deadline
    assert len(sink.events) == 4 and all(e.ann_checked for e in sink.events)
    stats = checker.stats()
    assert stats["hurried"] == 1 and stats["batches"] == 1 and stats["checked"] == 4
    checker.close()


def test_backlog_skips_are_counted_as_dropped():
    checker = AnnChecker(batch_size=4, max_wait_ms=10)
    cache, _, sink, _ = filled_cache("flat", entries=20, ann_checker=checker,
                                     event_executor=ManualExecutor(backlog=10_000))
    cache.lookup("t0", unit_id="u")
    assert checker.stats()["dropped"]["backlog"] == 1 and checker.stats()["submitted"] == 0
    checker.close()


def test_checks_over_their_cpu_budget_are_skipped_counted_quietly_and_resume_as_it_recovers(caplog):
    now = [0.0]
    # A billionth of a core, with 5 s of it as slack: any scan overspends it, and it takes
    # about 10^5 budget-seconds per 0.1 ms of scan to recover.
    checker = AnnChecker(batch_size=1, max_wait_ms=0, cpu_share=1e-9, clock=lambda: now[0])
    executor = ManualExecutor()
    cache, _, sink, _ = filled_cache("flat", entries=100, event_executor=executor, ann_checker=checker)
    executor.run_all()
    sink.events.clear()
    caplog.set_level(logging.INFO, logger="cache_core.store.ann_check")
    assert checker.within_budget()
    cache.lookup("t0", unit_id="u")
    assert until(lambda: checker.stats()["checked"] == 1)
    assert not checker.within_budget()
    cache.lookup("t10", unit_id="u")
    now[0] += 1e9  # the spend decays with the budget's time
    assert checker.within_budget()
    cache.lookup("t20", unit_id="u")
    assert until(lambda: checker.stats()["checked"] == 2)
    stats = checker.stats()
    assert stats["submitted"] == 2 and stats["dropped"]["budget"] == 1
    assert not [r for r in caplog.records if "dropped" in r.getMessage()]  # the design working, not a fault
    text = generate_latest(ServiceMetrics(cache, lambda: {}).registry).decode()
    assert 'scache_ann_checks_dropped_total{reason="budget"} 1.0' in text
    executor.run_all()
    assert [e.ann_checked for e in sink.events] == [True, False, True]
    checker.close()


def test_without_a_budget_every_sampled_check_runs():
    checker = AnnChecker(batch_size=1, max_wait_ms=0, cpu_share=0.0, clock=lambda: 0.0)
    cache, _, _, _ = filled_cache("flat", entries=100, ann_checker=checker)
    for i in range(0, 50, 10):
        cache.lookup(f"t{i}", unit_id="u")
    assert until(lambda: checker.stats()["checked"] == 5)
    assert checker.within_budget() and checker.stats()["dropped"]["budget"] == 0
    checker.close()


def test_the_app_batches_checks_exposes_them_in_metrics_and_drains_at_shutdown():
    vecs = clustered(50, seed=2)
    table = {f"t{i}": v for i, v in enumerate(vecs)}
    exp = experiment(ArmConfig(name="a", threshold=0.99, ann_check_rate=1.0))
    settings = Settings(cache={"ann_check_batch_size": 16, "ann_check_batch_wait_ms": 5000, "ann_check_cpu_share": 0.5},
                        service={"open_access": True})
    publisher = RecordingPublisher()
    app = create_app(build_components(settings, publisher, TableEmbedder(table),
                                      registry=ExperimentRegistry({exp.experiment_id: exp})))
    with TestClient(app) as client:
        for i in range(20):
            client.post("/v1/store", json={"query": f"t{i}", "answer": "a", "unit_id": "u"})
        for i in range(20):
            assert client.post("/v1/lookup", json={"query": f"t{i}", "unit_id": "u"}).json()["hit"]
        checker = app.state.components.cache.ann_checker
        assert checker.cpu_share == 0.5
        assert until(lambda: checker.stats()["checked"] == 16, timeout_s=4.0)
        text = client.get("/metrics").text
        assert "scache_ann_checks_batched_total 16.0" in text  # one full batch ran
        assert "scache_ann_check_pending 4.0" in text  # the rest waits for its 5 s deadline
        assert 'scache_ann_checks_dropped_total{reason="queue_full"} 0.0' in text
    looked = [e for e in publisher.events if e.query_chars and e.hit]
    assert len(looked) == 20 and all(e.ann_checked and e.ann_agree for e in looked)
