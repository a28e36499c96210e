-- scache warehouse schema, version 6: events_raw carries the judge's decision inputs
-- (cache_core.events.CacheEvent.judge_version / judge_probability / judge_ms), so hit rate,
-- false-hit rate and added latency can be read by judge version, and another operating
-- point re-evaluated offline. Placed after `guard`, in schema order.
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS judge_version Nullable(String) AFTER guard;
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS judge_probability Nullable(Float64) AFTER judge_version;
ALTER TABLE events_raw ADD COLUMN IF NOT EXISTS judge_ms Nullable(Float64) AFTER judge_probability;
