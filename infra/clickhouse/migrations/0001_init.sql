-- scache warehouse schema, version 1.
-- Applied by infra/clickhouse/migrate.py inside the target database (the client's
-- `database` setting), so table names are unqualified. Column lists must match
-- cache_core.events.clickhouse_columns(); tests/integration/test_schema_columns.py
-- checks it. LowCardinality(T) is a storage encoding of T, used on dimensions
-- with few distinct values; clients read and write plain T.

-- One row per cache decision (and heartbeat), as read from the events topic.
-- ReplacingMergeTree keyed by request_id (with the event time it always carries),
-- so an event re-sent after a Flink restart collapses into one row; read with FINAL
-- when exact counts matter before merges have run.
CREATE TABLE IF NOT EXISTS events_raw
(
    schema_version Int64,
    event_type LowCardinality(String),
    request_id String,
    ts_ms Int64,
    instance_id LowCardinality(String),
    namespace LowCardinality(String),
    experiment_id LowCardinality(String),
    arm LowCardinality(String),
    unit_id String,
    assignment_prob Float64,
    partition_mode LowCardinality(String),
    config_version Int64,
    variant LowCardinality(String),
    decision LowCardinality(String),
    hit Bool,
    threshold Nullable(Float64),
    similarity Nullable(Float64),
    intent_cluster Int64,
    embedding_l2_norm Nullable(Float64),
    entry_id Nullable(String),
    entry_age_s Nullable(Float64),
    entry_ttl_s Nullable(Float64),
    index_kind LowCardinality(String),
    ann_checked Bool,
    ann_agree Nullable(Bool),
    ann_recall_at_k Nullable(Float64),
    guard LowCardinality(Nullable(String)),
    embed_ms Float64,
    search_ms Float64,
    latency_ms Float64,
    query_chars Int64,
    query_text Nullable(String),
    ts DateTime64(3, 'UTC') MATERIALIZED fromUnixTimestamp64Milli(ts_ms, 'UTC')
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
PRIMARY KEY (experiment_id, arm, ts)
ORDER BY (experiment_id, arm, ts, request_id)
TTL toDateTime(ts) + INTERVAL 14 DAY DELETE;

-- The attribution job's windows. The whole dimension tuple is the sorting key and
-- emitted_at_ms the version, so a window re-emitted after a restart (or a late
-- update of the same window) replaces the earlier row instead of adding to it.
CREATE TABLE IF NOT EXISTS window_agg
(
    window_start DateTime64(3, 'UTC'),
    window_end DateTime64(3, 'UTC'),
    experiment_id LowCardinality(String),
    arm LowCardinality(String),
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
ORDER BY (experiment_id, arm, window_start, namespace, config_version, intent_cluster, index_kind, lifetime_bucket)
TTL toDateTime(window_start) + INTERVAL 180 DAY DELETE;

-- Audit log of every threshold / config change, manual or automatic.
CREATE TABLE IF NOT EXISTS threshold_changes
(
    ts DateTime64(3, 'UTC'),
    experiment_id LowCardinality(String),
    arm LowCardinality(String),
    actor String,
    old_threshold Nullable(Float64),
    new_threshold Float64,
    old_version Int64,
    new_version Int64,
    reason String,
    canary_share Nullable(Float64),
    config_json String
)
ENGINE = MergeTree
ORDER BY (experiment_id, ts);

-- Experiment definitions; the highest version of each experiment wins.
CREATE TABLE IF NOT EXISTS experiments
(
    experiment_id String,
    version Int64,
    config_json String,
    updated_by String,
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(version)
ORDER BY experiment_id;
