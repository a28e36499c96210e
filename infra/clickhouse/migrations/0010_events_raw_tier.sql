-- scache warehouse schema, version 10: events_raw carries the store tier that served a hit
-- (cache_core.events.CacheEvent.tier: "memory", or "disk" for an arm's disk tier,
-- cache_core.store.disk_tier). Placed after `index_kind`, in schema order
-- (tests/integration/test_schema_columns.py). Rows written before this version read NULL.
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS tier Nullable(String) AFTER index_kind;
