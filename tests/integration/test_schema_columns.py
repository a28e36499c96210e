"""The migrated tables agree with the event schema in cache_core/events.py."""
from __future__ import annotations

import re

import pytest

from cache_core.events import (
    CacheEvent, FeedbackAggregate, FeedbackEvent, LateEventCount, WindowAggregate, clickhouse_columns,
)
from infra.clickhouse.migrate import apply_migrations, load_migrations

pytestmark = pytest.mark.integration


def _logical(ch_type: str) -> str:
    """LowCardinality(T) is only a storage encoding of T: clients read and write T."""
    match = re.fullmatch(r"LowCardinality\((.*)\)", ch_type)
    return match.group(1) if match else ch_type


def _stored_columns(client, table: str) -> list[tuple[str, str]]:
    rows = client.query(
        "SELECT name, type FROM system.columns WHERE database = currentDatabase() AND table = {t:String} "
        "AND default_kind != 'MATERIALIZED' ORDER BY position", parameters={"t": table}).result_rows
    return [(name, _logical(ch_type)) for name, ch_type in rows]


@pytest.mark.parametrize(("table", "model"), [
    ("events_raw", CacheEvent), ("window_agg", WindowAggregate), ("feedback_raw", FeedbackEvent),
    ("shadow_feedback_raw", FeedbackEvent), ("feedback_agg", FeedbackAggregate), ("late_events", LateEventCount)])
def test_table_columns_match_event_schema(ch_client, table, model):
    assert _stored_columns(ch_client, table) == clickhouse_columns(model)


@pytest.mark.parametrize("table", ["events_raw", "feedback_raw", "shadow_feedback_raw"])
def test_raw_tables_have_materialized_time(ch_client, table):
    rows = ch_client.query("SELECT type, default_kind FROM system.columns WHERE database = currentDatabase() "
                           "AND table = {t:String} AND name = 'ts'", parameters={"t": table}).result_rows
    assert rows == [("DateTime64(3, 'UTC')", "MATERIALIZED")]


def test_migrations_are_recorded_and_idempotent(ch_client):
    assert apply_migrations(ch_client, "scache") == []
    recorded = ch_client.query("SELECT name FROM schema_migrations FINAL ORDER BY version").result_rows
    assert [name for (name,) in recorded] == [m.name for m in load_migrations()]


def test_resent_rows_replace_instead_of_doubling(ch_client):
    now_ms = ch_client.command("SELECT toUnixTimestamp64Milli(now64(3))")
    event = {name: None for name, _ in clickhouse_columns(CacheEvent)}
    event.update(CacheEvent(request_id="resent-1", ts_ms=now_ms, experiment_id="exp-resend", arm="a").model_dump())
    columns = list(event)
    for _ in range(2):
        ch_client.insert("events_raw", [list(event.values())], column_names=columns)
    assert ch_client.command("SELECT count() FROM events_raw FINAL WHERE request_id = 'resent-1'") == 1
    # A recent window: rows past the table's TTL are dropped on insert.
    start, end = ch_client.command("SELECT toStartOfMinute(now()) AS s, s + INTERVAL 1 MINUTE")
    window = {"window_start": start, "window_end": end, "experiment_id": "exp-resend",
              "arm": "a", "variant": "base", "namespace": "default", "config_version": 1, "intent_cluster": -1, "index_kind": "flat",
              "lifetime_bucket": "fresh"}
    for emitted_at_ms, requests in ((1, 5), (3, 9), (2, 7)):
        ch_client.command(
            "INSERT INTO window_agg (window_start, window_end, experiment_id, arm, variant, namespace, config_version, "
            "intent_cluster, index_kind, lifetime_bucket, requests, emitted_at_ms) VALUES "
            "({window_start:DateTime64(3)}, {window_end:DateTime64(3)}, {experiment_id:String}, {arm:String}, {variant:String}, "
            "{namespace:String}, {config_version:Int64}, {intent_cluster:Int64}, {index_kind:String}, "
            "{lifetime_bucket:String}, {requests:Int64}, {emitted_at_ms:Int64})",
            parameters={**window, "requests": requests, "emitted_at_ms": emitted_at_ms})
    rows = ch_client.query("SELECT requests FROM window_agg FINAL WHERE experiment_id = 'exp-resend'").result_rows
    assert rows == [(9,)]


def test_latest_verdict_per_request_wins(ch_client):
    columns = [name for name, _ in clickhouse_columns(FeedbackEvent)]
    for ts_ms, verdict in ((2_000, "wrong"), (1_000, "correct")):  # arrival order != feedback time
        row = FeedbackEvent(request_id="fb-latest-1", verdict=verdict, ts_ms=ch_client.command(
            "SELECT toUnixTimestamp64Milli(now64(3))") + ts_ms).model_dump()
        ch_client.insert("feedback_raw", [[row[c] for c in columns]], column_names=columns)
    assert ch_client.query("SELECT verdict FROM feedback_raw FINAL WHERE request_id = 'fb-latest-1'"
                           ).result_rows == [("wrong",)]
