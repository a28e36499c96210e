-- scache warehouse schema, version 3: events_raw carries the multi-similarity decision
-- inputs (cache_core.events.CacheEvent.similarity_mode / score / score_margin), so a
-- multi arm's mixed-score threshold and answer margin can be re-evaluated offline.
-- Placed after `similarity`, in schema order (tests/integration/test_schema_columns.py).
-- Rows written before this version read similarity_mode '' (not known then), score NULL.
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS similarity_mode LowCardinality(String) DEFAULT '' AFTER similarity;
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS score Nullable(Float64) AFTER similarity_mode;
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS score_margin Nullable(Float64) AFTER score;
