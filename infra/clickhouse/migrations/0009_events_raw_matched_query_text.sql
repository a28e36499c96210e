-- scache warehouse schema, version 9: events_raw carries the cached question of the entry served
-- (or the nearest one) beside query_text, under the same setting (cache.emit_query_text). A verdict
-- joined to such an event is a labelled (query, cached_query) pair: judge_train --warehouse reads them.
-- Placed after `query_text`, in schema order (tests/integration/test_schema_columns.py).
-- Rows written before this version read NULL.
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS matched_query_text Nullable(String) AFTER query_text;
