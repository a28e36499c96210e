-- scache warehouse schema, version 8: events_raw carries why a request bypassed the cache
-- (cache_core.events.CacheEvent.bypass_reason: the chat proxy's field policy, docs/proxy.md).
-- Placed after `decision`, in schema order (tests/integration/test_schema_columns.py).
-- Rows written before this version read NULL.
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS bypass_reason Nullable(String) AFTER decision;
