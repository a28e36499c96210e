"""Write-ahead log + snapshots: restore after snapshot and log replay, torn tails, locking."""
from __future__ import annotations

import pytest

from cache_core.cache import SemanticCache
from cache_core.experiments import ArmConfig
from cache_core.state.persistence import Persistence, PersistenceError
from cache_core.registry import ExperimentRegistry
from tests.unit.cache_core.helpers import ManualClock, TableEmbedder, experiment, unit_vec

TABLE = {f"q{i}": unit_vec(*([0.0] * i + [1.0])) for i in range(6)}


def open_cache(directory, clock, table=TABLE):
    exp = experiment(ArmConfig(name="a", threshold=0.9, ttl_s=100))
    cache = SemanticCache(TableEmbedder(dict(table)), ExperimentRegistry({"exp": exp}), clock=clock)
    persistence = Persistence(directory)
    report = persistence.open(cache)
    return cache, persistence, report


def test_snapshot_plus_log_replay_restores_everything_alive(tmp_path):
    clock = ManualClock()
    cache, persistence, report = open_cache(tmp_path, clock)
    assert report.entries == 0 and report.snapshot is None
    cache.store("q0", "zero", unit_id="u")
    cache.store("q1", "one", unit_id="u", ttl_s=10)
    persistence.snapshot()                              # q0, q1 in the snapshot
    clock.advance(5)
    cache.store("q2", "two", unit_id="u")               # only in the log
    cache.store("q0", "zero v2", unit_id="u")           # replaces q0 (remove + put logged)
    cache.store("q3", "three", unit_id="t", namespace="tenant")
    assert cache.clear_namespace("tenant") == 1         # logged as one clear
    persistence.close(final_snapshot=False)             # as if killed: no final snapshot

    clock.advance(6)                                    # q1 (ttl 10, age 11) has expired
    restored, again, report = open_cache(tmp_path, clock)
    assert report.snapshot is not None and report.snapshot_entries == 2
    assert report.replayed_records >= 4 and report.torn_records == 0
    assert report.expired_dropped == 1 and report.entries == 2
    first = restored.lookup("q0", unit_id="u")
    assert first.hit and first.answer == "zero v2" and first.event.entry_age_s == pytest.approx(6)
    assert restored.lookup("q2", unit_id="u").answer == "two"
    assert not restored.lookup("q1", unit_id="u").hit
    assert not restored.lookup("q3", unit_id="t", namespace="tenant").hit
    # A second generation: the restored state snapshots and restores again.
    again.snapshot()
    again.close()
    third, last, report = open_cache(tmp_path, clock)
    assert report.entries == 2 and report.replayed_records == 0
    last.close()


def test_torn_last_record_is_ignored(tmp_path):
    clock = ManualClock()
    cache, persistence, _ = open_cache(tmp_path, clock)
    cache.store("q0", "zero", unit_id="u")
    cache.store("q1", "one", unit_id="u")
    segment = persistence.journal.directory / f"wal-{persistence.journal.stats.segment:08d}.log"
    persistence.close(final_snapshot=False)
    data = segment.read_bytes()
    segment.write_bytes(data[:-40])                     # the last write never completed
    restored, again, report = open_cache(tmp_path, clock)
    assert report.torn_records == 1 and report.entries == 1
    assert restored.lookup("q0", unit_id="u").hit
    again.close()


def test_one_directory_one_process(tmp_path):
    _, persistence, _ = open_cache(tmp_path, ManualClock())
    with pytest.raises(PersistenceError, match="in use"):
        open_cache(tmp_path, ManualClock())
    persistence.close()


def test_clusters_survive_a_restart(tmp_path):
    clock = ManualClock()
    cache, persistence, _ = open_cache(tmp_path, clock)
    ids = [cache.lookup(f"q{i}", unit_id="u").intent_cluster for i in range(4)]
    persistence.close()                                 # final snapshot holds the clusters
    restored, again, _ = open_cache(tmp_path, clock)
    # Asked in reverse order: fresh clusters would number them 0, 1, 2, 3 again.
    reverse = [restored.lookup(f"q{i}", unit_id="u").intent_cluster for i in reversed(range(4))]
    assert reverse == ids[::-1] and ids == [0, 1, 2, 3]
    again.close()
