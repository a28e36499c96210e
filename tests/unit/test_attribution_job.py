"""jobs/: the generated SQL and the sink's pure helpers (no services)."""
from __future__ import annotations

from datetime import datetime, timezone

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
    assert "WATERMARK FOR ts AS ts - INTERVAL '2' SECOND" in ddl
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
    assert "event_type <> 'heartbeat'" in job.DECISIONS_SQL


def test_window_agg_row_is_utc_and_stamped():
    start = datetime(2026, 1, 1, 12, 0, 0)
    values = [start, datetime(2026, 1, 1, 12, 1, 0), "e", "a", "ns", 1, 2, "flat", "fresh",
              10, 5, 3.5, 8.0, 9, 2, 2, 0, 120.0, [1] * LATENCY_BUCKETS]
    row = sink.window_agg_row(values, emitted_at_ms=42)
    assert row[0] == start.replace(tzinfo=timezone.utc) and row[-1] == 42
    assert len(row) == len(sink.AGG_COLUMNS)


def test_dedup_token_ignores_emission_time_and_row_order():
    skip = [2]  # the emitted_at_ms column of these rows
    a = [["w", 1, 100], ["w", 2, 100]]
    b = [["w", 2, 999], ["w", 1, 999]]  # same batch re-sent later, other order
    assert sink.dedup_token("window_agg", "k", a, skip) == sink.dedup_token("window_agg", "k", b, skip)
    assert sink.dedup_token("window_agg", "k", a, skip) != sink.dedup_token("window_agg", "k2", a, skip)
    assert sink.dedup_token("window_agg", "k", a, skip) != \
        sink.dedup_token("window_agg", "k", [["w", 1, 100]], skip)


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
