-- scache warehouse schema, version 14: window_agg counts the hits the disk tier served
-- (cache_core.events.WindowAggregate.disk_hits, from events_raw's tier of migration 0010;
-- memory hits are hits - disk_hits), so the dashboard reads hit rate by tier from the
-- aggregates. Placed after `hits`, in the model's order (tests/integration/test_schema_columns.py).
-- Windows written before this version read 0: their disk hits, if any, count as memory.
ALTER TABLE window_agg ADD COLUMN IF NOT EXISTS disk_hits Int64 DEFAULT 0 AFTER hits;
