-- scache warehouse schema, version 4: events_raw carries the embedding cache's part in each
-- decision (cache_core.events.CacheEvent.embed_cached / embed_saved_ms): whether the query's
-- embedding came from the exact-text LRU in front of the encoder, and the encode time it saved.
-- Placed after `embed_ms`, in schema order (tests/integration/test_schema_columns.py).
-- Rows written before this version read embed_cached false, embed_saved_ms 0 (no cache then).
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS embed_cached Bool DEFAULT false AFTER embed_ms;
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS embed_saved_ms Float64 DEFAULT 0 AFTER embed_cached;
