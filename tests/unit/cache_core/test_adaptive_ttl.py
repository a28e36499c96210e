"""The adaptive TTL policy (cache_core.adaptive_ttl) and its part in lookups, stores and events.
Clocks are injected: nothing sleeps."""
from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from cache_core.events import CacheEvent, clickhouse_columns
from cache_core.experiments import ArmConfig
from cache_core.adaptive_ttl import AdaptiveTtl, TrafficStats, TtlContext
from tests.unit.cache_core.test_cache import make_cache

CALM = TtlContext(rate_volatility=0.0, hit_trend=0.0, memory_pressure=0.0, entry_hits=0)
FULL = TtlContext(rate_volatility=0.0, hit_trend=0.0, memory_pressure=1.0, entry_hits=0)


def test_prediction_converges_to_the_quantile_of_reuse_gaps():
    model = AdaptiveTtl(0.0, 300.0, quantile=0.9, learning_rate=0.02)
    gaps = np.random.default_rng(0).exponential(20.0, 20_000)
    for gap in gaps:
        model.observe(CALM, gap)
    assert model.predict(CALM) == pytest.approx(np.quantile(gaps, 0.9), rel=0.2)  # ~46 s


def test_predictions_stay_in_the_configured_range():
    model = AdaptiveTtl(5.0, 300.0)
    assert model.predict(CALM) == pytest.approx(np.sqrt(5 * 300))  # the prior: the range's middle
    for _ in range(2000):
        model.observe(CALM, 10_000.0)
    assert model.predict(CALM) == 300.0
    for _ in range(5000):
        model.observe(CALM, 0.0)
    assert model.predict(CALM) == 5.0
    model.clamp_to(0.0, 1.0)
    assert model.predict(CALM) <= 1.0
    with pytest.raises(ValueError):
        AdaptiveTtl(10.0, 5.0)


def test_context_moves_the_prediction_the_way_the_gaps_do():
    model = AdaptiveTtl(0.0, 300.0, learning_rate=0.02)
    rng = np.random.default_rng(1)
    for _ in range(20_000):  # under memory pressure, reuses come sooner (or not at all)
        model.observe(CALM, rng.exponential(60.0))
        model.observe(FULL, rng.exponential(6.0))
    assert model.predict(FULL) < model.predict(CALM) / 3
    assert model.weights[3] < 0  # memory_pressure's weight


def test_traffic_volatility_and_hit_trend():
    steady, bursty = TrafficStats(), TrafficStats()
    for second in range(120):
        for _ in range(5):
            steady.record(float(second), hit=False)
        for _ in range(50 if second % 30 == 0 else 0):
            bursty.record(float(second), hit=False)
    assert steady.volatility(120.0) == pytest.approx(0.0, abs=1e-9)
    assert bursty.volatility(120.0) > 1.0
    assert TrafficStats().volatility(0.0) == 0.0
    trend = TrafficStats()
    for _ in range(200):
        trend.record(0.0, hit=False)
    for _ in range(20):
        trend.record(1.0, hit=True)
    assert trend.trend() > 0.5


E0 = np.eye(8, dtype=np.float32)[0]
ADAPTIVE = ArmConfig(name="a", threshold=0.8, ttl_policy="adaptive", ttl_min_s=0.0, ttl_max_s=300.0,
                     ann_check_rate=0.0)


def test_entries_get_predicted_lifetimes_renewed_at_each_hit_and_logged():
    cache, clock, sink, _ = make_cache({"q": E0}, ADAPTIVE)
    cache.store("q", "answer", unit_id="u")
    entry = next(iter(cache.partitions()[0].entries.values()))
    assert entry.ttl_policy == "adaptive" and entry.ttl_s == pytest.approx(np.sqrt(300.0))
    for _ in range(30):  # reused every 5 s, well inside its lifetime: each hit teaches "5 s"
        clock.advance(5.0)
        assert cache.lookup("q", unit_id="u").hit
        assert entry.expires_at() == pytest.approx(clock() + entry.ttl_s)
    event = sink.events[-1]
    assert event.ttl_predicted_s == pytest.approx(entry.ttl_s)
    assert event.ttl_entry_hits == 30 and event.ttl_memory_pressure >= 0
    assert event.ttl_rate_volatility is not None and event.ttl_hit_trend is not None
    assert 5.0 < event.ttl_predicted_s < np.sqrt(300.0)  # learning the 5 s gaps from above


@pytest.mark.parametrize("swept", [False, True], ids=["meets-the-expired-entry", "after-the-sweep-removed-it"])
def test_a_lookup_after_its_entry_expired_teaches_a_longer_lifetime(swept):
    """Met expired, or missed after the expiry sweep removed the entry (its ghost is observed)."""
    cache, clock, sink, _ = make_cache({"q": E0}, ADAPTIVE)
    predictions = []
    for _ in range(40):  # asked again every 100 s: longer than the prior's 17 s
        cache.store("q", "answer", unit_id="u")
        clock.advance(100.0)
        if swept:
            cache.drop_expired()
        result = cache.lookup("q", unit_id="u")
        predictions.append(sink.events[-1].ttl_predicted_s)
        if result.hit:
            break
    assert predictions[-1] > predictions[0] * 2
    life = cache.lifetimes._stores[cache.partitions()[0].key]
    assert life.model.observations >= 1


def test_fixed_ttl_arms_log_no_prediction():
    cache, clock, sink, _ = make_cache({"q": E0}, ArmConfig(name="a", threshold=0.8, ttl_s=120.0))
    cache.store("q", "answer", unit_id="u")
    clock.advance(10.0)
    cache.lookup("q", unit_id="u")
    event = sink.events[-1]
    assert event.hit and event.ttl_predicted_s is None and event.ttl_entry_hits is None
    assert event.entry_ttl_s == pytest.approx(120.0)


def test_an_explicit_ttl_on_the_store_wins_over_the_prediction():
    cache, _, _, _ = make_cache({"q": E0}, ADAPTIVE)
    cache.store("q", "answer", unit_id="u", ttl_s=42.0)
    assert next(iter(cache.partitions()[0].entries.values())).ttl_s == 42.0


def test_arm_and_event_schema():
    with pytest.raises(ValidationError):
        ArmConfig(name="a", ttl_policy="adaptive", ttl_min_s=400.0, ttl_max_s=300.0)
    assert (ArmConfig(name="a").ttl_min_s, ArmConfig(name="a").ttl_max_s) == (0.0, 300.0)
    names = [n for n, _ in clickhouse_columns(CacheEvent)]
    at = names.index("entry_ttl_s")
    assert names[at + 1:at + 6] == ["ttl_predicted_s", "ttl_rate_volatility", "ttl_hit_trend",
                                    "ttl_memory_pressure", "ttl_entry_hits"]
    assert dict(clickhouse_columns(CacheEvent))["ttl_entry_hits"] == "Nullable(Int64)"
