-- scache warehouse schema, version 2 (wave 2 contracts, see notes on each table).
-- Column lists must match cache_core.events (WindowAggregate, FeedbackEvent,
-- FeedbackAggregate, LateEventCount); tests/integration/test_schema_columns.py checks it.

-- window_agg gains the canary `variant` dimension (after arm, in the sorting key).
-- ClickHouse can only append new columns to a sorting key, and no window_agg was
-- deployed before this version, so the table is recreated rather than altered.
DROP TABLE IF EXISTS window_agg;

CREATE TABLE window_agg
(
    window_start DateTime64(3, 'UTC'),
    window_end DateTime64(3, 'UTC'),
    experiment_id LowCardinality(String),
    arm LowCardinality(String),
    variant LowCardinality(String),
    namespace LowCardinality(String),
    config_version Int64,
    intent_cluster Int64,
    index_kind LowCardinality(String),
    lifetime_bucket LowCardinality(String),
    requests Int64,
    hits Int64,
    decayed_hits Float64,
    similarity_sum Float64,
    similarity_count Int64,
    ann_checks Int64,
    ann_agreements Int64,
    guard_blocks Int64,
    latency_sum_ms Float64,
    latency_hist Array(Int64),
    emitted_at_ms Int64
)
ENGINE = ReplacingMergeTree(emitted_at_ms)
PARTITION BY toYYYYMM(window_start)
ORDER BY (experiment_id, arm, variant, window_start, namespace, config_version, intent_cluster, index_kind, lifetime_bucket)
TTL toDateTime(window_start) + INTERVAL 180 DAY DELETE;

-- One row per request with feedback, as read from the feedback topic. The latest
-- verdict (by feedback time) on a request wins, matching the job's feedback_agg.
CREATE TABLE IF NOT EXISTS feedback_raw
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

-- Labelled hits per feedback event-time window x the joined decision's dimensions.
CREATE TABLE IF NOT EXISTS feedback_agg
(
    window_start DateTime64(3, 'UTC'),
    window_end DateTime64(3, 'UTC'),
    experiment_id LowCardinality(String),
    arm LowCardinality(String),
    variant LowCardinality(String),
    namespace LowCardinality(String),
    config_version Int64,
    intent_cluster Int64,
    correct Int64,
    wrong Int64,
    emitted_at_ms Int64
)
ENGINE = ReplacingMergeTree(emitted_at_ms)
PARTITION BY toYYYYMM(window_start)
ORDER BY (experiment_id, arm, variant, window_start, namespace, config_version, intent_cluster)
TTL toDateTime(window_start) + INTERVAL 180 DAY DELETE;

-- Decisions later than the allowed lateness (their window was already final):
-- counted here instead of silently dropped. They still reach events_raw.
CREATE TABLE IF NOT EXISTS late_events
(
    window_start DateTime64(3, 'UTC'),
    window_end DateTime64(3, 'UTC'),
    experiment_id LowCardinality(String),
    arm LowCardinality(String),
    late_count Int64,
    emitted_at_ms Int64
)
ENGINE = ReplacingMergeTree(emitted_at_ms)
PARTITION BY toYYYYMM(window_start)
ORDER BY (experiment_id, arm, window_start)
TTL toDateTime(window_start) + INTERVAL 180 DAY DELETE;
