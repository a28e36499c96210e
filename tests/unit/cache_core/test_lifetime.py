"""Background expiry (cache_core.lifetime): a store no request reaches any more loses its
expired entries, which lazy expiry alone never removes (bench/soak.py found them piling up)."""
from __future__ import annotations

import ctypes
import os

import pytest

from fastapi.testclient import TestClient

from cache_core import heap
from cache_core.cache import SemanticCache
from cache_core.experiments import ArmConfig
from cache_core.lifetime import ExpirySweeper
from cache_core.registry import ExperimentRegistry
from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from infra.runtime import wait_until
from tests.unit.cache_core.helpers import ManualClock, RecordingPublisher, TableEmbedder, experiment, unit_vec


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



def stores(cache) -> set[str]:
    return {p.key[0] for p in cache.partitions()}


def test_a_store_left_empty_for_a_whole_interval_is_retired_and_comes_back_on_use():
    cache, clock = make_cache()
    cache.store("old question", "a", unit_id="u", namespace="abandoned", ttl_s=10)
    cache.store("kept question", "b", unit_id="u", namespace="busy", ttl_s=1000)
    clock.advance(20)
    sweeper = ExpirySweeper(cache, interval_s=60)
    sweeper.sweep()  # removes the expired entry: the store changed in this pass, so it stays
    assert stores(cache) == {"abandoned", "busy"}
    sweeper.sweep()  # empty and untouched since the last pass
    assert stores(cache) == {"busy"} and sweeper.stats()["stores_retired"] == 1
    assert not cache.lookup("old question", unit_id="u", namespace="abandoned").hit
    assert cache.store("old question", "again", unit_id="u", namespace="abandoned").stored
    assert cache.lookup("old question", unit_id="u", namespace="abandoned").answer == "again"
    sweeper.sweep()
    sweeper.sweep()
    assert stores(cache) == {"abandoned", "busy"}  # stores holding entries are never retired


def test_an_insert_into_a_store_retired_under_it_lands_in_its_successor():
    """A request holds its store from before the lock: had the sweep (or a clear) taken it out
    of the map meanwhile, the insert would be acknowledged and logged yet served by nothing."""
    cache, _ = make_cache()
    cache.lookup("old question", unit_id="u", namespace="n")  # makes the (empty) store
    stale = next(p for p in cache.partitions() if p.key[0] == "n")
    cache.retire_idle_stores()
    assert cache.retire_idle_stores() == 1 and stale.retired
    fetched = iter([stale])  # the first fetch returns the store as the request saw it
    with cache.stores.live(lambda: next(fetched, None) or cache.stores.for_key(stale.key)) as partition:
        assert partition is not stale and not partition.retired
    assert cache.store("old question", "a", unit_id="u", namespace="n").stored
    assert cache.lookup("old question", unit_id="u", namespace="n").hit

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
    app = create_app(build_components(Settings(service={"open_access": True}), RecordingPublisher(), minilm_embedder, clock=clock,
                                      expiry_sweep_s=0.02))
    with TestClient(app) as client:
        stored = client.post("/v1/store", json={"query": "How do I close my account?", "answer": "Settings.",
                                                "unit_id": "u1", "namespace": "trial-7", "ttl_s": 5})
        assert stored.status_code == 200 and stored.json()["stored"]
        assert client.get("/healthz").json()["entries"] == 1
        clock.advance(10)
        wait_until(lambda: client.get("/healthz").json()["entries"] == 0, 5, "the service's sweep")
        assert client.get("/healthz").json()["expiry"]["removed"] == 1
    assert not app.state.components.expiry.stats()["alive"]  # stopped with the app



def rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


@pytest.mark.skipif(not heap._load() or not os.path.exists("/proc/self/status"), reason="glibc and /proc only")
def test_the_thread_gives_freed_heap_memory_back_to_the_os():
    libc = heap._load()
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    # 160 MB in 64 KB blocks (under the mmap threshold: from the heap), every 16th kept, so the
    # freed ones sit between live blocks where free() alone never returns them.
    blocks = [libc.malloc(64 * 1024) for _ in range(2560)]
    for block in blocks:
        ctypes.memset(block, 1, 64 * 1024)
    for n, block in enumerate(blocks):
        if n % 16:
            libc.free(block)
    before = rss_mb()
    cache, _ = make_cache()
    sweeper = ExpirySweeper(cache, interval_s=0.02).start()
    try:
        wait_until(lambda: sweeper.trims >= 1, 5, "a heap trim")
    finally:
        sweeper.stop()
        for block in blocks[::16]:
            libc.free(block)
    assert sweeper.errors == 0 and rss_mb() < before - 100


_FRAGMENT = """
import ctypes, sys
sys.path.insert(0, {root!r})
from cache_core import heap
if {pin}:
    assert heap.pin_mmap_threshold()
libc = heap._load()
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1024
libc.free(libc.malloc(4 << 20))  # freeing a mapped 4 MB block raises the threshold past it, unless pinned
blocks = [libc.malloc(1 << 20) for _ in range(200)]  # as an encoder batch's buffers
for b in blocks:
    ctypes.memset(b, 1, 1 << 20)
before = rss()
for b in blocks[:-1]:  # the last stays in use, as the next batch's would
    libc.free(b)
print(before - rss())
"""


@pytest.mark.skipif(not heap._load() or not os.path.exists("/proc/self/status"), reason="glibc and /proc only")
def test_a_pinned_mmap_threshold_gives_freed_megabyte_buffers_back_at_once():
    import subprocess
    import sys

    from infra.runtime import REPO_ROOT

    def released_mb(pin: bool) -> float:
        out = subprocess.run([sys.executable, "-c", _FRAGMENT.format(root=str(REPO_ROOT), pin=pin)],
                             capture_output=True, text=True, timeout=60, env={"PATH": os.environ.get("PATH", "")})
        assert out.returncode == 0, out.stderr
        return float(out.stdout)

    assert released_mb(pin=False) < 50       # glibc's default: the freed 199 MB stay in the heap
    assert released_mb(pin=True) > 150       # pinned: each was its own mapping, returned on free
