-- scache warehouse schema, version 11: events_raw carries which level learnt the threshold of an
-- arm with an error-bounded threshold policy (cache_core.events.CacheEvent.threshold_source:
-- entry, cluster, arm or static; cache_core.decision.error_bound). Placed after `threshold`, in
-- schema order (tests/integration/test_schema_columns.py). Rows written before read NULL.
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS threshold_source Nullable(String) AFTER threshold;
