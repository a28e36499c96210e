"""jobs/: the generated SQL and the sink's pure helpers (no services)."""
from __future__ import annotations

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

from cache_core.events import CacheEvent, WindowAggregate, flink_columns
from cache_core.settings import Settings
from jobs import attribution_job as job
from jobs import clickhouse_sink as sink
from udfs.buckets import LATENCY_BUCKETS


def _settings(**flink) -> Settings:
    return Settings(flink={"window_s": 7, "watermark_delay_s": 2, "idle_timeout_s": 3,
                           "group_id": "g1", "startup_mode": "latest-offset", **flink},
                    kafka={"bootstrap_servers": "10.1.2.3:9092", "events_topic": "ev"})


def test_source_ddl_has_every_event_column_and_settings():
    ddl = job.source_ddl(_settings())
    for name, sql_type in flink_columns(CacheEvent):
        assert f"`{name}` {sql_type}" in ddl
    assert "ts AS TO_TIMESTAMP_LTZ(ts_ms, 3)" in ddl
    # watermark_delay_s (2) + allowed_lateness_s (default 30)
    assert "WATERMARK FOR ts AS ts - INTERVAL '0:00:32' HOUR TO SECOND" in ddl
    assert "pt AS PROCTIME()" in ddl
    for option in ("'topic' = 'ev'", "'properties.bootstrap.servers' = '10.1.2.3:9092'",
                   "'properties.group.id' = 'g1'", "'scan.startup.mode' = 'latest-offset'",
                   "'scan.watermark.idle-timeout' = '3 s'", "'format' = 'json'"):
        assert option in ddl


def test_window_sql_outputs_window_aggregate_fields_in_order():
    sql = job.window_agg_sql(7)
    assert "INTERVAL '7' SECOND" in sql
    assert sql.count("latency_bucket = ") == LATENCY_BUCKETS
    positions = [sql.index(f" AS {c}") if f" AS {c}" in sql else sql.index(c)
                 for c in sink.AGG_INPUT_COLUMNS]
    assert positions == sorted(positions)
    assert sink.AGG_COLUMNS == list(WindowAggregate.model_fields)


def test_heartbeats_are_filtered_from_aggregates_and_raw():
    assert "event_type <> 'heartbeat'" in job.decisions_sql(_settings())
    assert "event_type = 'decision' AND hit" in job.feedback_join_sql(_settings())


def test_lateness_flag_matches_window_firing():
    # A window [s, s+w) fires when the watermark reaches s+w-1: later events are late.
    sql = job.decisions_sql(_settings(window_s=7))
    assert "TO_TIMESTAMP_LTZ((ts_ms - MOD(ts_ms, 7000)) + 6999, 3) <= CURRENT_WATERMARK(ts)" in sql


def test_interval_literal_beyond_99_seconds():
    assert job._interval(3600) == "INTERVAL '1:00:00' HOUR TO SECOND"
    assert job._interval(95) == "INTERVAL '0:01:35' HOUR TO SECOND"
    assert "INTERVAL '1:00:00' HOUR TO SECOND" in job.feedback_join_sql(_settings(feedback_join_s=3600))


def test_sink_rows_carry_table_key_and_json_body():
    spec = sink.TABLES[sink.WINDOW_AGG]
    assert spec.input_columns == sink.AGG_INPUT_COLUMNS
    sql = job._as_sink_rows(sink.WINDOW_AGG, "v", spec.input_columns, spec.keys)
    assert sql.startswith("SELECT 'window_agg' AS tbl, CONCAT_WS('|', CAST(`window_start_ms` AS STRING)")
    assert "KEY 'window_start' VALUE DATE_FORMAT(TO_TIMESTAMP_LTZ(window_start_ms, 3)" in sql
    assert "KEY 'variant' VALUE `variant`" in sql


def test_raw_batches_join_json_rows_in_java_without_listagg():
    batch_sql, rows_sql = job.raw_batches_sql(sink.EVENTS_RAW, "raw_events", sink.RAW_COLUMNS, _settings())
    # LISTAGG re-concatenates its accumulator per row: quadratic in the batch size.
    assert "LISTAGG" not in batch_sql
    assert "ARRAY_JOIN(ARRAY_AGG(row_json), ',') AS body" in batch_sql
    assert rows_sql.count("KEY '") == len(sink.RAW_COLUMNS) and "KEY 'request_id' VALUE `request_id`" in rows_sql


def test_ticks_reach_every_aggregate_table_once_per_flush_interval():
    sql = job.ticks_sql(_settings(raw_batch_s=4))
    # Heartbeats count: with no traffic, a restored table's pending rows must still flush.
    assert "FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(pt), INTERVAL '4' SECOND))" in sql
    assert "heartbeat" not in sql
    # Correlated to the window row: a constant UNNEST would plan as a bounded Values source
    # inner-joined to the stream (join state growing per window, a task FINISHED early).
    assert "ARRAY['window_agg', 'late_events', 'feedback_agg'] AS tick_tables" in sql
    assert "CROSS JOIN UNNEST(w.tick_tables)" in sql
    assert f"'{sink.TICK_BODY}' AS body" in sql


def test_flush_timers_align_to_the_interval():
    # Flink keeps one timer per key and timestamp: aligned timestamps coalesce.
    assert sink.flush_due_ms(10_000, 1000) == 11_000
    assert sink.flush_due_ms(10_999, 1000) == 11_000
    assert {sink.flush_due_ms(t, 5000) for t in range(20_000, 25_000, 7)} == {25_000}


def test_stamped_and_emptied_rows():
    body = '{"window_start":"2026-01-01 12:00:00.000","experiment_id":"e","correct":3,"wrong":1}'
    assert sink.stamp(body, 42) == body[:-1] + ',"emitted_at_ms":42}'
    assert sink.insert_body([body, body], 7).count('"emitted_at_ms":7') == 2
    zero = sink.emptied(sink.FEEDBACK_AGG, body)
    assert '"correct":0' in zero and '"wrong":0' in zero and '"experiment_id":"e"' in zero
    hist = sink.emptied(sink.WINDOW_AGG, '{"requests":4,"latency_hist":[1,3],"arm":"a"}')
    assert hist == '{"requests":0,"latency_hist":[0,0],"arm":"a"}'


def test_latest_checkpoint_picks_newest_completed(tmp_path):
    assert job.latest_checkpoint(tmp_path) is None
    old = tmp_path / "job1" / "chk-3"
    new = tmp_path / "job2" / "chk-1"
    incomplete = tmp_path / "job2" / "chk-2"
    for path in (old, new, incomplete):
        path.mkdir(parents=True)
    (old / "_metadata").write_bytes(b"x")
    (new / "_metadata").write_bytes(b"x")
    import os
    os.utime(old, (1, 1))
    assert job.latest_checkpoint(tmp_path) == new


class _Clock:
    """A fake monotonic clock that sleeping advances."""

    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _failing(times: int, error: Exception):
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= times:
            raise error
        return "inserted"
    return call, calls


def test_an_unreachable_warehouse_is_retried_with_backoff_until_it_answers():
    clock = _Clock()
    call, calls = _failing(5, OperationalError("Connection refused"))
    assert sink.retry_unreachable(call, 30, "insert", sleep=clock.sleep, clock=lambda: clock.now) == "inserted"
    assert len(calls) == 6 and clock.sleeps == [0.5, 1.0, 2.0, 4.0, 5.0]


def test_a_long_outage_raises_once_the_retry_budget_is_spent():
    clock = _Clock()
    call, calls = _failing(1000, OperationalError("Connection refused"))
    with pytest.raises(OperationalError):
        sink.retry_unreachable(call, 10, "insert", sleep=clock.sleep, clock=lambda: clock.now)
    assert sum(clock.sleeps) <= 10 and len(calls) == len(clock.sleeps) + 1 >= 3
    # No budget: the first failure raises (the job restarts from its checkpoint).
    call, calls = _failing(1, OperationalError("Connection refused"))
    with pytest.raises(OperationalError):
        sink.retry_unreachable(call, 0, "insert", sleep=clock.sleep, clock=lambda: clock.now)
    assert len(calls) == 1


def test_an_error_the_server_answers_with_is_not_retried():
    clock = _Clock()
    call, calls = _failing(1, DatabaseError("Code: 60. Unknown table"))
    with pytest.raises(DatabaseError):
        sink.retry_unreachable(call, 30, "insert", sleep=clock.sleep, clock=lambda: clock.now)
    assert len(calls) == 1 and clock.sleeps == []


def test_user_and_shadow_feedback_are_kept_apart():
    joined = job.feedback_join_sql(_settings())
    assert "COALESCE(f.source, 'user') AS source" in joined
    assert "PARTITION BY request_id, source" in job.FEEDBACK_LATEST_SQL
    agg = job.feedback_agg_sql(60)
    assert "intent_cluster, source" in agg.split("GROUP BY")[1]
    assert sink.TABLES[sink.FEEDBACK_AGG].keys[-1] == "source"
    assert "source = 'shadow'" in job.RAW_FEEDBACK_VIEWS["shadow_feedback"]
    assert "<> 'shadow'" in job.RAW_FEEDBACK_VIEWS["user_feedback"]
    assert sink.SHADOW_FEEDBACK_RAW in sink.RAW_TABLES


def test_window_aggregates_count_the_hits_each_store_tier_served():
    # A hit logged before events carried the tier (migration 0010) counts as memory.
    assert "COALESCE(tier, 'memory') AS tier" in job.decisions_sql(_settings())
    assert "index_kind, tier, hit," in job.ENRICHED_SQL
    sql = job.window_agg_sql(7)
    assert "CAST(SUM(CASE WHEN hit AND tier = 'disk' THEN 1 ELSE 0 END) AS BIGINT) AS disk_hits" in sql
    spec = sink.TABLES[sink.WINDOW_AGG]
    assert "disk_hits" in spec.counters and "tier" not in spec.keys  # a count per window, not a key
    assert spec.input_columns.index("disk_hits") == spec.input_columns.index("hits") + 1
    assert '"disk_hits":0' in sink.emptied(sink.WINDOW_AGG, '{"hits":3,"disk_hits":2,"arm":"a"}')
