-- scache warehouse schema, version 5: events_raw carries the adaptive TTL policy's prediction and
-- its inputs (cache_core.events.CacheEvent.ttl_predicted_s, ttl_rate_volatility, ttl_hit_trend,
-- ttl_memory_pressure, ttl_entry_hits; cache_core.lifetime), null on arms with a fixed TTL.
-- Placed after `entry_ttl_s`, in schema order (tests/integration/test_schema_columns.py).
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS ttl_predicted_s Nullable(Float64) AFTER entry_ttl_s;
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS ttl_rate_volatility Nullable(Float64) AFTER ttl_predicted_s;
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS ttl_hit_trend Nullable(Float64) AFTER ttl_rate_volatility;
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS ttl_memory_pressure Nullable(Float64) AFTER ttl_hit_trend;
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS ttl_entry_hits Nullable(Int64) AFTER ttl_memory_pressure;
