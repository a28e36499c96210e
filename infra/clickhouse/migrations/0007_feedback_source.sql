-- scache warehouse schema, version 7: user and shadow verdicts kept apart (issue 25).
-- A shadow check (cache_core.shadow) publishes FeedbackEvent(source='shadow') under the request id
-- it judges, which may also have a user's verdict: in feedback_raw (ReplacingMergeTree keyed by
-- request_id) one would replace the other. So shadow verdicts get their own raw table, and
-- feedback_agg counts per source. A column new to the sorting key may have no default: rows written
-- before this version read source = '' and count as users' (readers filter source <> 'shadow').
-- feedback_raw keeps the users' verdicts only: every estimate read from it stays a user estimate.
CREATE TABLE IF NOT EXISTS shadow_feedback_raw
(
    schema_version Int64,
    request_id String,
    verdict LowCardinality(String),
    ts_ms Int64,
    source LowCardinality(String),
    ts DateTime64(3, 'UTC') MATERIALIZED fromUnixTimestamp64Milli(ts_ms, 'UTC')
)
ENGINE = ReplacingMergeTree(ts_ms)
ORDER BY request_id
TTL toDateTime(ts) + INTERVAL 180 DAY DELETE;

ALTER TABLE feedback_agg
    ADD COLUMN IF NOT EXISTS source LowCardinality(String) AFTER intent_cluster,
    MODIFY ORDER BY (experiment_id, arm, variant, window_start, namespace, config_version, intent_cluster, source);
