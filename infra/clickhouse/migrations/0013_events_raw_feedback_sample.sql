-- scache warehouse schema, version 13: events_raw carries whether the service asked the user for a
-- verdict on a hit and with which probability (cache_core.events.CacheEvent.feedback_requested /
-- feedback_prob; ArmConfig.feedback_sample_rate, docs/solicited_feedback.md), so solicited verdicts
-- can be weighed by 1 / feedback_prob and kept apart from self-selected ones. Placed after `hit`,
-- in schema order (tests/integration/test_schema_columns.py). Rows written before read false / NULL.
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS feedback_requested Bool DEFAULT false AFTER hit;
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS feedback_prob Nullable(Float64) AFTER feedback_requested;
